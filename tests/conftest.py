import pytest


def pytest_collection_modifyitems(config, items):
    """Skip `gpu`-marked tests where no CUDA device exists (they run on GPU machines)."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def no_heavy_imports(tmp_path):
    """A PYTHONPATH where importing torch, omegaconf or hydra fails loudly."""
    blocker = tmp_path / "blocker"
    for name in ("torch", "omegaconf", "hydra"):
        (blocker / name).mkdir(parents=True)
        (blocker / name / "__init__.py").write_text(f"raise ImportError('{name} must not be imported here')\n")
    return {"PYTHONPATH": str(blocker)}
