"""``python -m agentrl.cli ...``: the `agentrl` command without its console script (the launch
scripts and the tests run it so, with the interpreter they name)."""

import sys

from agentrl.cli import main

sys.exit(main())
