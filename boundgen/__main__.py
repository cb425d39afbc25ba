import sys

from boundgen.cli.main import main

sys.exit(main())
