"""`onnxtrain federated simulate` parsing and errors (the runs themselves are in test_simulation.py)."""

from __future__ import annotations

import argparse

import pytest

from onnxtrain.federated import cli


def test_add_parser_registers_federated_simulate():
    parser = argparse.ArgumentParser(prog="onnxtrain")
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["federated", "simulate", "--clients", "4", "--rounds", "2", "--freeze-first-layer"])
    assert (args.command, args.federated_command, args.clients, args.rounds) == ("federated", "simulate", 4, 2)
    assert args.freeze_first_layer and args.run is cli.run


def test_main_reports_bad_arguments_in_one_line(capsys):
    pytest.importorskip("flwr")
    assert cli.main(["simulate", "--clients", "0"]) == 1
    assert capsys.readouterr().err.strip() == ("onnxtrain federated: error: need at least one client and one round, "
                                               "got clients=0, rounds=3")
