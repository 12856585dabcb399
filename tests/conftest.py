import pytest
import torch

import gemsops


def cuda_ok():
    return torch.cuda.is_available() and gemsops.cuda_available()


def pytest_collection_modifyitems(config, items):
    if cuda_ok():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and a CUDA build")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
