"""Where the tests find the checkout: its root, tests/, the goldens, the C stubs."""
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
GOLDEN = TESTS / "golden"
STUB_CUDA = TESTS / "support" / "stub_cuda"
