"""What `coppelius node` runs on: every GPU the driver shows this process (an ordinal under
CUDA_VISIBLE_DEVICES, as CUDA counts, with its UUID and PCI bus id), or CPU slots for the
interpret backend."""
from __future__ import annotations

from dataclasses import dataclass

from coppelius.errors import BackendUnavailable
from coppelius.staging.errors import UserError

from coppelius.driver.device import visible_devices

CPU_NAME = "cpu (triton interpreter)"


class NodeRefused(UserError):
    """`coppelius node` cannot run at all (exit 2): no GPU, a bad reference, a bad option."""


@dataclass(frozen=True)
class Target:
    index: int              # the --device ordinal (cuda), the slot (interpret)
    name: str
    uuid: str               # "GPU-…", "" on the CPU
    pci_bus_id: str         # "0000:65:00.0", "" on the CPU

    def label(self) -> str:
        where = f" {self.uuid} ({self.pci_bus_id})" if self.uuid else ""
        return f"GPU {self.index}{where}" if self.uuid else f"slot {self.index}"


def targets(backend: str, count: int = 1) -> list[Target]:
    """cuda: every visible GPU; interpret: `count` slots on the CPU."""
    if backend == "interpret":
        if count < 1:
            raise NodeRefused(f"--count {count}: at least one slot", "e.g. --count 2")
        return [Target(i, CPU_NAME, "", "") for i in range(count)]
    try:
        gpus = visible_devices()
    except BackendUnavailable as e:
        raise NodeRefused(f"could not run: {e.message}", e.hint) from None
    if not gpus:
        raise NodeRefused("could not run: the driver shows no GPU",
                          "check CUDA_VISIBLE_DEVICES and nvidia-smi")
    return [Target(g.ordinal, g.name, g.uuid_text, g.pci_bus_id) for g in gpus]
