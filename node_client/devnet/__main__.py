"""``python -m node_client.devnet``: run a devnet until interrupted."""
import argparse
import sys

from node_client.devnet.cli import add_arguments, cli_main

parser = argparse.ArgumentParser(prog="python -m node_client.devnet", description=__doc__)
add_arguments(parser)
sys.exit(cli_main(parser.parse_args()))
