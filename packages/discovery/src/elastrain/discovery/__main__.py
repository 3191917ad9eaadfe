import sys

from elastrain.discovery._private.report import main

sys.exit(main())
