"""The findings, one family of rules a module: data (the input pipeline), restarts (workers
started again each epoch), host (CPU oversubscription, periodic host work), gpu, distributed
(the setup, with straggler), comm (communication and synchronisation).

Each module's ``RULES`` lists its rules; ``rules.RULES`` is the one registry, in that order.
"""
