import sys

try:
    from repro.training.cli import main

    code = main()
except KeyboardInterrupt:  # Ctrl-C while the modules load, before any handler is in place
    print("repro train: interrupted (SIGINT) before it started; nothing was done", file=sys.stderr)
    code = 130
sys.exit(code)
