"""Starting the ranks of a probe: ``ranks`` (torch's launcher, the script's own spawning or an
outer launcher; timeouts, process groups, the exit's classification), ``agent_server`` (what
the fork server that forks torch's launcher imports), ``coordinate`` (the probes of a run on
several nodes) and ``allocation`` (an allocation that started the ranks already: SLURM, a
PyTorchJob, an outer torchrun)."""
