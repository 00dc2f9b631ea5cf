"""`python -m tools.gpu_check`: the device check's command (tools/gpu_check.sh runs it)."""
import sys

from tools.gpu_check.check import main

sys.exit(main())
