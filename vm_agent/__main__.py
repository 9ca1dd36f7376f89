"""`python -m vm_agent`: the agent, with its settings from the environment (agent.env)."""

import sys

from vm_agent.agent import main

sys.exit(main())
