"""A DDP script that trains on a folder of JPEG files (DATA, written by the test), decoded and
resized with Pillow in the script's own loader (no workers), as image-classification scripts
do: the loading's CPU goes to decoding."""

import os

import torch
import torch.distributed as dist
from PIL import Image
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class JpegFolder(Dataset):
    def __init__(self, root):
        self.paths = sorted(os.path.join(root, name) for name in os.listdir(root))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        with Image.open(self.paths[index]) as image:
            pixels = image.convert("RGB").resize((32, 32), Image.BILINEAR)
        x = torch.frombuffer(bytearray(pixels.tobytes()), dtype=torch.uint8)
        return x.view(32, 32, 3).permute(2, 0, 1).float() / 255.0, index % 10


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    data = JpegFolder(os.environ["DATA"])
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(50):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
