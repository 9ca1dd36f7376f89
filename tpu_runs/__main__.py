import sys

from tpu_runs.cli import main

sys.exit(main())
