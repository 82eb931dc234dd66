"""strata's benchmarks against qemu-nbd and other peers, run by
bench/bench.py (cli.main). cli holds the command line, cases/ one module
per case and the registry (cases/__init__.py), the other modules what
several cases share; bench/README.md maps them and says how to add a case."""
