"""The torch device a configured ``device`` setting names (``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``), checked
against what this torch build and machine have, so a CUDA device on a CPU-only machine is a
:class:`~inferscale.errors.ConfigError` rather than torch's ``AssertionError`` from deep inside a model load."""

from __future__ import annotations

from inferscale.errors import ConfigError


def checked_device(device: str, setting: str) -> str:
    """The device ``device`` names: ``"auto"`` is ``"cuda"`` when a CUDA device is visible, else ``"cpu"``; any
    other value as given once it is usable here.

    Args:
        device: the configured value.
        setting: the setting's name, for the error (``"engine.device"``, ``"embedder.device"``).

    Raises:
        ConfigError: for a CUDA device when this torch build has no CUDA or no CUDA device is visible, or a
            ``cuda:N`` whose N is not one of the visible devices.
    """
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return device
    if not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise ConfigError(f"{setting} is {device!r}, but {why} (torch {torch.__version__}): use 'cpu' or 'auto'")
    visible = torch.cuda.device_count()
    if index and (not index.isdigit() or int(index) >= visible):
        raise ConfigError(f"{setting} is {device!r}, but the visible CUDA devices are cuda:0 to cuda:{visible - 1}")
    return device


__all__ = ["checked_device"]
