import sys

from prefill_worker import main

sys.exit(main())
