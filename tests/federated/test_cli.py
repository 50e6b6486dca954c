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
    assert capsys.readouterr().err.strip() == "onnxtrain federated: error: clients must be a positive integer, got 0"


@pytest.mark.parametrize("argv, message", [
    (["--alpha", "-1"], "alpha must be positive and finite, got -1.0"),
    (["--lr", "inf"], "learning-rate must be positive and finite, got inf"),
    (["--batch-size", "0"], "batch-size must be a positive integer, got 0"),
    (["--lr", "nan"], "learning-rate must be positive and finite, got nan"),
    (["--local-epochs", "0"], "local-epochs must be a positive integer, got 0"),
    (["--strategy", "FedSGD"], "strategy 'FedSGD' is not a Flower strategy derived from FedAvg"),
    (["--clients", "500"], "cannot give 500 partitions at least 10 examples each"),
    (["--proximal-mu", "0.1"], "--proximal-mu is the weight of FedProx's proximal term; add --strategy FedProx"),
    (["--strategy", "FedProx", "--proximal-mu", "-1"], "proximal-mu must be finite and non-negative"),
])
def test_bad_settings_are_refused_before_ray_starts(capsys, tmp_path, argv, message):
    """Before, --alpha -1 ran every round with every client failing and exited 0 with the initial model."""
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    assert cli.main(["simulate", "--output-dir", str(tmp_path), *argv]) == 1
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())   # nothing built, nothing started


def test_a_run_without_any_accepted_update_is_an_error():
    pytest.importorskip("flwr")
    from onnxtrain.federated.simulation import _check_progress

    history = [{"round": 0}, {"round": 1, "accepted": 0, "failures": [{"node": 3, "reason": "alpha must be positive"}],
                              "rejections": []}]
    with pytest.raises(RuntimeError, match="no client update was accepted in 1 round.*alpha must be positive"):
        _check_progress(history, 1)
    _check_progress([{"round": 0}, {"round": 1, "accepted": 1}], 1)
    with pytest.raises(RuntimeError, match="ended after 1 of 2 rounds"):
        _check_progress([{"round": 0}, {"round": 1, "accepted": 1}], 2)
