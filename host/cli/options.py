"""Options more than one command takes (no command of its own): `--device`."""
from __future__ import annotations


def device_ordinal(text: str) -> int:
    """--device's value: a GPU ordinal, 0 or more (argparse names the option when it fails)."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


device_ordinal.__name__ = "GPU ordinal"          # argparse: "invalid GPU ordinal value: '-1'"


def add_device_argument(parser) -> None:
    parser.add_argument("--device", type=device_ordinal, default=0, metavar="N",
                        help="the GPU to open: its ordinal among the devices CUDA_VISIBLE_DEVICES "
                        "leaves visible, as CUDA counts them (default 0)")
