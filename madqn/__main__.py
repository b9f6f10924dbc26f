import sys

from madqn.cli import main

sys.exit(main())
