"""The ``onnxtrain`` command through its real entry point (a subprocess), good and bad input alike."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.checkpoint import load_checkpoint
from tests.cli.conftest import assert_one_line_error, hide_modules, run_cli


def _records(path) -> list[dict]:
    return [json.loads(line) for line in open(path) if line.strip()]


def _epochs(path) -> list[dict]:
    return [r for r in _records(path) if "epoch" in r and "train_loss" in r]


# -- happy paths --------------------------------------------------------------------------------------------------
def test_help_version_and_console_script():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for command in ("generate", "train", "eval", "export", "info", "data", "ops", "demo"):
        assert command in proc.stdout
    assert run_cli("--version").stdout.startswith("onnxtrain ")
    script = shutil.which("onnxtrain", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("the onnxtrain console script is not installed (pip install -e .)")
    proc = subprocess.run([script, "train", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "--resume" in proc.stdout


def test_generate_stores_config_and_info_reports_it(workdir):
    info = json.loads(run_cli("info", workdir / "arts", "--json").stdout)
    assert info["train_config"] == {"epochs": 2, "lr": 3e-3, "batch_size": 32}
    assert info["inputs"] == [{"name": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8]}]
    assert info["labels"][0]["dtype"] == "int64"
    assert info["additional_outputs"][0]["name"] == "logits"  # predictions for accuracy, by default
    assert info["trainable"]["elements"] == 13706 and info["frozen"]["count"] == 0
    assert info["optimizer"]["type"] == "AdamW" and info["opsets"] == {"ai.onnx": 17}
    text = run_cli("info", workdir / "arts").stdout
    assert "train config: epochs=2" in text and "13,706" in text


def test_generate_writes_the_train_step_model_on_request(workdir, tmp_path):
    """--train-step-model: the fused graph the JavaScript package runs; without the flag, no such file."""
    from onnxtrain.conventions import TrainStepMeta

    out = tmp_path / "fused"
    proc = run_cli("generate", workdir / "cnn.onnx", "-o", out, "--loss", "ce", "--epochs", "1",
                   "--train-step-model")
    assert proc.returncode == 0, proc.stderr
    assert "train_step_model.onnx" in proc.stdout
    fused = onnx.load(out / "train_step_model.onnx")
    meta = TrainStepMeta.from_model(fused)
    assert meta.reset is True
    session = ort.InferenceSession(str(out / "train_step_model.onnx"), providers=["CPUExecutionProvider"])
    inputs = [i.name for i in session.get_inputs()]
    assert inputs[:2] == ["image", "labels"] and f"{meta.prefix}learning_rate" in inputs
    assert not (tmp_path / "plain").exists()
    assert run_cli("generate", workdir / "cnn.onnx", "-o", tmp_path / "plain", "--loss", "ce").returncode == 0
    assert not (tmp_path / "plain" / "train_step_model.onnx").exists()


def test_generate_parameter_selection(workdir, tmp_path):
    out = tmp_path / "head"
    proc = run_cli("generate", workdir / "cnn.onnx", "-o", out, "--loss", "CrossEntropyLoss", "--trainable-ops", "3",
                   "--optimizer", "sgd", "--momentum", "0.9", "--nesterov")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(run_cli("info", out, "--json").stdout)
    assert list(info["trainable"]["tensors"]) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert info["optimizer"]["config"]["momentum"] == 0.9
    out2 = tmp_path / "glob"
    proc = run_cli("generate", workdir / "cnn.onnx", "-o", out2, "--loss", "ce", "--requires-grad", "conv*",
                   "--frozen", "fc1.*", "--additional-outputs", "--nominal")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(run_cli("info", out2, "--json").stdout)
    assert list(info["trainable"]["tensors"]) == ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"]
    assert info["additional_outputs"] == [] and not info["checkpoint"]["nominal"]
    assert load_checkpoint(out2 / "nominal_checkpoint").nominal


def test_train_eval_export(workdir, arts):
    proc = run_cli("train", arts, "--data", workdir / "train.npz", "--val", workdir / "val.npz", "--progress", "plain")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("training ") and "metrics: accuracy" in lines[0]
    assert [ln.split()[1] for ln in lines if ln.startswith("epoch ")] == ["1/2", "2/2"]  # epochs=2 from the artifacts
    assert "val loss" in lines[1] and "ex/s" in lines[1]
    run = arts / "run"
    assert (run / "last.ckpt").is_file() and (run / "best.ckpt").is_file()
    records = _epochs(run / "metrics.jsonl")
    assert [r["epoch"] for r in records] == [1, 2]
    assert {"train_loss", "val_loss", "train_accuracy", "val_accuracy", "lr", "examples_per_second"} <= set(records[0])
    assert records[1]["train_loss"] < records[0]["train_loss"]
    assert (run / "training_curve.png").is_file() == ("plot:        " + str(run / "training_curve.png") in proc.stdout)

    proc = run_cli("eval", arts, "--data", workdir / "val.npz", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["examples"] == 80 and result["checkpoint"].endswith("last.ckpt")
    assert result["accuracy"] == pytest.approx(records[-1]["val_accuracy"])

    model = arts / "model.onnx"
    proc = run_cli("export", arts, "-o", model)
    assert proc.returncode == 0, proc.stderr
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    data = np.load(workdir / "val.npz")
    logits = session.run(None, {"image": data["x"]})[0]
    assert np.mean(logits.argmax(1) == data["y"]) == pytest.approx(result["accuracy"])


def test_command_line_overrides_stored_options_and_val_split(workdir, arts, tmp_path):
    log = tmp_path / "log.jsonl"
    proc = run_cli("train", arts, "--data", workdir / "train.npz", "--epochs", "1", "--val-split", "0.25",
                   "--scheduler", "cosine", "--metrics", "accuracy,top5_accuracy", "--log", log)
    assert proc.returncode == 0, proc.stderr
    start, *epochs = _records(log)
    assert start["options"]["epochs"] == 1 and start["options"]["lr"] == 3e-3  # lr still from the artifacts
    assert start["train_examples"] == 240 and start["val_examples"] == 80
    assert len(epochs) == 1 and "val_top5_accuracy" in epochs[0]


def test_resume_needs_flags_and_continues(workdir, arts):
    assert run_cli("train", arts, "--data", workdir / "train.npz", "--epochs", "1").returncode == 0
    assert_one_line_error(run_cli("train", arts, "--data", workdir / "train.npz"), "--resume", "--restart")
    assert_one_line_error(run_cli("train", arts, "--data", workdir / "train.npz", "--resume", "--epochs", "1"),
                          "already finished 1 epochs")
    proc = run_cli("train", arts, "--data", workdir / "train.npz", "--resume", "--epochs", "3")
    assert proc.returncode == 0, proc.stderr
    assert [ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("epoch ")] == ["2/3", "3/3"]
    assert [r["epoch"] for r in _epochs(arts / "run" / "metrics.jsonl")] == [1, 2, 3]
    info = json.loads(run_cli("info", arts, "--json").stdout)
    assert info["run"]["last"]["progress"]["epoch"] == 3
    assert info["run"]["last"]["progress"]["global_step"] == 30  # 10 batches of 32 per epoch
    # `--resume DIR` (the folder right after the flag): argparse gave DIR to --resume and stopped at "DIR required"
    proc = run_cli("train", "--resume", arts, "--data", workdir / "train.npz", "--epochs", "4")
    assert proc.returncode == 0, proc.stderr
    assert [ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("epoch ")] == ["4/4"]
    assert_one_line_error(run_cli("train", "--data", workdir / "train.npz"), "required: DIR")


def test_export_onto_an_artifact_and_generate_from_an_artifact_are_refused(workdir, arts, tmp_path):
    """`export -o DIR/eval_model.onnx` overwrote the eval model (later commands: "not generated by onnxtrain");
    `generate DIR/training_model.onnx` failed inside a pass ("Graph must be in single static assignment")."""
    eval_bytes = (arts / "eval_model.onnx").read_bytes()
    assert_one_line_error(run_cli("export", arts, "-o", arts / "eval_model.onnx"), "one of the artifacts' own files")
    assert (arts / "eval_model.onnx").read_bytes() == eval_bytes
    assert_one_line_error(run_cli("generate", arts / "training_model.onnx", "-o", tmp_path / "again", "--loss",
                                  "mse"), "is an artifact generate_artifacts wrote", "not a forward model")


def test_a_restart_that_fails_loses_nothing_of_the_previous_run(workdir, arts):
    """--restart used to delete the finished run's checkpoints before training: a new run that failed at its
    first step (a learning rate too high) left nothing. Its files now wait in run/previous/."""
    assert run_cli("train", arts, "--data", workdir / "train.npz", "--epochs", "1").returncode == 0
    last = (arts / "run" / "last.ckpt").read_bytes()
    proc = run_cli("train", arts, "--data", workdir / "train.npz", "--epochs", "1", "--lr", "1e30", "--restart")
    assert proc.returncode != 0 and "not finite" in proc.stderr
    assert (arts / "run" / "previous" / "last.ckpt").read_bytes() == last
    assert (arts / "run" / "previous" / "best.ckpt").is_file()
    assert [r["epoch"] for r in _epochs(arts / "run" / "previous" / "metrics.jsonl")] == [1]
    assert not (arts / "run" / "last.ckpt").exists()   # nothing of the failed run passes for a finished one
    proc = run_cli("train", arts, "--data", workdir / "train.npz", "--epochs", "1", "--restart")
    assert proc.returncode == 0, proc.stderr
    assert "run/previous" in proc.stdout.replace(os.sep, "/")


def test_ctrl_c_saves_then_resume_finishes(workdir, arts):
    cmd = [sys.executable, "-m", "onnxtrain.cli", "train", str(arts), "--data", str(workdir / "train.npz"),
           "--epochs", "100", "--batch-size", "2", "--progress", "none"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("epoch 1/100"):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "stopping after this step" in err
    assert "interrupted " in out and "continue with --resume" in out
    progress = json.loads(run_cli("info", arts, "--json").stdout)["run"]["last"]["progress"]
    done = progress["epoch"]
    assert done >= 1 and progress["global_step"] == 160 * done + progress["batch"]
    if progress["batch"]:  # stopped mid-epoch: other batches would silently skip the rest of the epoch
        assert_one_line_error(run_cli("train", arts, "--data", workdir / "train.npz", "--resume", "--epochs",
                                      done + 1, "--batch-size", "8"), "batches of 2 over 320 examples",
                              "same --batch-size and data")
    proc = run_cli("train", arts, "--data", workdir / "train.npz", "--resume", "--epochs", done + 1,
                   "--batch-size", "2")
    assert proc.returncode == 0, proc.stderr
    final = json.loads(run_cli("info", arts, "--json").stdout)["run"]["last"]["progress"]
    assert final["epoch"] == done + 1 and final["global_step"] == 160 * (done + 1)


def _save_linear(path, outputs: int) -> None:
    """y = x w^T + b, 4 features in, ``outputs`` out, dynamic batch; w all ones, b zeros."""
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", outputs])],
        initializer=[numpy_helper.from_array(np.ones((outputs, 4), np.float32), "w"),
                     numpy_helper.from_array(np.zeros(outputs, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def test_nan_loss_stops_with_a_clear_message(tmp_path):
    _save_linear(tmp_path / "linear.onnx", 1)
    x = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32) * 10
    np.savez(tmp_path / "reg.npz", x=x, y=x @ np.arange(1, 5, dtype=np.float32))  # y [N] is reshaped to [N, 1]
    assert run_cli("generate", tmp_path / "linear.onnx", "-o", tmp_path / "a", "--loss", "mse", "--optimizer", "sgd",
                   ).returncode == 0
    proc = run_cli("train", tmp_path / "a", "--data", tmp_path / "reg.npz", "--lr", "1000", "--epochs", "3")
    assert_one_line_error(proc, "training stopped in epoch 1", "not finite", "--lr")
    assert _records(tmp_path / "a" / "run" / "metrics.jsonl")[-1]["event"] == "nonfinite"
    proc = run_cli("train", tmp_path / "a", "--data", tmp_path / "reg.npz", "--lr", "1e-3", "--epochs", "2",
                   "--metrics", "mae", "--restart")
    assert proc.returncode == 0 and "mae" in proc.stdout


def test_progress_falls_back_without_tqdm_and_plot_without_matplotlib(workdir, arts, tmp_path):
    hidden = hide_modules(tmp_path / "hidden", "tqdm", "matplotlib")
    proc = run_cli("train", arts, "--data", workdir / "train.npz", "--epochs", "1", "--progress", "bar",
                   env_path=hidden)
    assert proc.returncode == 0, proc.stderr
    assert "tqdm is not installed" in proc.stderr
    assert "not written: matplotlib is not installed" in proc.stdout
    assert not (arts / "run" / "training_curve.png").exists()


def test_ops_prints_the_table_or_one_line():
    proc = run_cli("ops", "Conv", "Relu")
    try:
        import onnxtrain.autodiff.coverage  # noqa: F401
    except ImportError:
        assert_one_line_error(proc, "coverage")
        return
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["op", "version", "status"]
    assert [ln.split()[0] for ln in lines[1:]] == ["Conv", "Relu"] and all(" rule " in ln for ln in lines[1:])
    assert_one_line_error(run_cli("ops", "NotAnOp"), "'NotAnOp'")
    assert_one_line_error(run_cli("ops", "Conv", "Foo", "Bar"), "'Foo', 'Bar' are not default-domain ONNX ops")


def test_ops_of_a_model(workdir):
    """`onnxtrain ops MODEL.onnx`: the coverage of the model's own op types (a model's path was an unknown op)."""
    proc = run_cli("ops", workdir / "cnn.onnx")
    assert proc.returncode == 0, proc.stderr
    model_ops = sorted({n.op_type for n in onnx.load(workdir / "cnn.onnx").graph.node})
    assert [ln.split()[0] for ln in proc.stdout.splitlines()[1:]] == model_ops


# -- bad input: one line on stderr, non-zero exit, never a traceback -------------------------------------------------
def _write_bad_files(workdir, folder):
    rng = np.random.default_rng(0)
    np.savez(folder / "flat.npz", x=rng.random((20, 64), dtype=np.float32), y=np.arange(20) % 10)
    np.savez(folder / "labels.npz", x=rng.random((20, 1, 8, 8), dtype=np.float32), y=np.arange(20))
    np.savez(folder / "bytes.npz", x=rng.integers(0, 255, (20, 1, 8, 8), dtype=np.uint8), y=np.arange(20) % 10)
    np.savez(folder / "keys.npz", a=np.zeros(3))
    np.savez(folder / "pickled.npz", x=np.array([{"a": 1}], dtype=object), y=np.zeros(1))
    (folder / "junk.npz").write_bytes(b"not a zip")
    ckpt = bytearray((workdir / "arts" / "checkpoint").read_bytes())
    (folder / "truncated.ckpt").write_bytes(bytes(ckpt[:500]))
    ckpt[-50] ^= 0xFF
    (folder / "flipped.ckpt").write_bytes(bytes(ckpt))


BAD_INPUT = {
    "missing data file": (["train", "{arts}", "--data", "{tmp}/missing.npz"], ["data file not found"]),
    "missing artifact folder": (["train", "{tmp}/nowhere", "--data", "{work}/train.npz"], ["not found"]),
    "not an artifact folder": (["eval", "{tmp}", "--data", "{work}/train.npz"], ["not an onnxtrain artifact folder"]),
    "shapes do not match": (["train", "{arts}", "--data", "{tmp}/flat.npz"], ["[20, 64]", "[N, 1, 8, 8]", "--shape"]),
    "labels out of range": (["train", "{arts}", "--data", "{tmp}/labels.npz"], ["label 10", "[0, 9]"]),
    "labels out of range in eval": (["eval", "{arts}", "--data", "{tmp}/labels.npz"], ["label 10"]),
    "uint8 inputs": (["train", "{arts}", "--data", "{tmp}/bytes.npz"], ["uint8", "--scale 255"]),
    "npz without x": (["eval", "{arts}", "--data", "{tmp}/keys.npz"], ["no array 'x'"]),
    "pickled npz": (["eval", "{arts}", "--data", "{tmp}/pickled.npz"], ["pickled"]),
    "not a zip": (["eval", "{arts}", "--data", "{tmp}/junk.npz"], ["not a .npz"]),
    "corrupt checkpoint": (["eval", "{arts}", "--data", "{work}/val.npz", "--checkpoint", "{tmp}/flipped.ckpt"],
                           ["corrupt or was altered"]),
    "truncated checkpoint": (["export", "{arts}", "-o", "{tmp}/m.onnx", "--checkpoint", "{tmp}/truncated.ckpt"],
                             ["truncated"]),
    "no checkpoint yet": (["eval", "{arts}", "--data", "{work}/val.npz", "--checkpoint", "best"], ["no best"]),
    "missing model": (["generate", "{tmp}/missing.onnx", "-o", "{tmp}/o", "--loss", "mse"], ["model not found"]),
    "model is not onnx": (["generate", "{tmp}/junk.npz", "-o", "{tmp}/o", "--loss", "mse"], ["not a valid ONNX"]),
    "unknown parameter": (["generate", "{work}/cnn.onnx", "-o", "{tmp}/o", "--loss", "mse", "--requires-grad", "nope"],
                          ["'nope'"]),
    "option for another optimizer": (["generate", "{work}/cnn.onnx", "-o", "{tmp}/o", "--loss", "ce", "--momentum",
                                      "0.9"], ["--momentum applies to --optimizer sgd"]),
    "unknown loss": (["generate", "{work}/cnn.onnx", "-o", "{tmp}/o", "--loss", "hinge"], ["unknown loss 'hinge'"]),
    "class axis for mse": (["generate", "{work}/cnn.onnx", "-o", "{tmp}/o", "--loss", "mse", "--class-axis", "-1"],
                           ["--class-axis applies to the cross-entropy and nll losses"]),
    "class axis not an axis": (["generate", "{work}/cnn.onnx", "-o", "{tmp}/o", "--loss", "ce", "--class-axis", "3"],
                               ["class_axis=3"]),
    "unknown scheduler": (["train", "{arts}", "--data", "{work}/train.npz", "--scheduler", "exp"], ["invalid choice"]),
    "unknown metric": (["train", "{arts}", "--data", "{work}/train.npz", "--metrics", "f1"], ["--metrics"]),
    "bad epochs": (["train", "{arts}", "--data", "{work}/train.npz", "--epochs", "0"], ["--epochs"]),
    "missing required option": (["train", "{arts}"], ["--data"]),
    "unknown command": (["fly"], ["invalid choice"]),
    "resume without a run": (["train", "{arts}", "--data", "{work}/train.npz", "--resume"], ["nothing to resume"]),
    "val and val-split": (["train", "{arts}", "--data", "{work}/train.npz", "--val", "{work}/val.npz", "--val-split",
                           "0.1"], ["either --val or --val-split"]),
    "unknown export output": (["export", "{arts}", "-o", "{tmp}/m.onnx", "--outputs", "nope"], ["nope"]),
    "info on nothing": (["info", "{tmp}/nothing"], ["not found"]),
}


# the list, through a real process; the rest in-process (same code, without the start-up cost)
THROUGH_A_PROCESS = ["missing data file", "shapes do not match", "labels out of range", "corrupt checkpoint",
                     "truncated checkpoint", "unknown scheduler", "missing model"]


@pytest.mark.parametrize("case", THROUGH_A_PROCESS)
def test_bad_input_is_one_line(case, workdir, arts, tmp_path):
    _write_bad_files(workdir, tmp_path)
    args, fragments = BAD_INPUT[case]
    args = [a.format(arts=arts, tmp=tmp_path, work=workdir) for a in args]
    assert_one_line_error(run_cli(*args), *fragments)


@pytest.mark.parametrize("case", [c for c in BAD_INPUT if c not in THROUGH_A_PROCESS])
def test_bad_input_is_one_line_in_process(case, workdir, arts, tmp_path, capsys):
    from onnxtrain.cli.main import main

    _write_bad_files(workdir, tmp_path)
    args, fragments = BAD_INPUT[case]
    try:
        code = main([a.format(arts=arts, tmp=tmp_path, work=workdir) for a in args])
    except SystemExit as exit:  # argparse errors
        code = exit.code
    captured = capsys.readouterr()
    assert_one_line_error(subprocess.CompletedProcess([], code, captured.out, captured.err), *fragments)


def test_corrupt_last_checkpoint_on_resume(workdir, arts):
    assert run_cli("train", arts, "--data", workdir / "train.npz", "--epochs", "1").returncode == 0
    last = arts / "run" / "last.ckpt"
    data = bytearray(last.read_bytes())
    data[-10] ^= 0xFF
    last.write_bytes(bytes(data))
    proc = run_cli("train", arts, "--data", workdir / "train.npz", "--resume", "--epochs", "2")
    assert_one_line_error(proc, "last.ckpt", "corrupt")
    assert proc.stdout == ""


def test_debug_shows_the_traceback(workdir, arts):
    proc = run_cli("--debug", "eval", arts, "--data", workdir / "missing.npz")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_unexpected_errors_are_one_line_too(monkeypatch, capsys):
    from onnxtrain.cli import info, main

    def broken(args):
        raise AttributeError("a bug")

    monkeypatch.setattr(info, "run", broken)
    assert main.main(["info", "x"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("onnxtrain: error: internal error (AttributeError") and len(err.splitlines()) == 1


def test_a_dataset_named_after_the_model_inputs_is_read(workdir, arts, tmp_path):
    """np.savez(..., input=x, labels=y) with the model's own input names needs no conversion; other names get
    an error that offers both spellings."""
    model = onnx.load(arts / "training_model.onnx", load_external_data=False)
    data_input, label_input = model.graph.input[0].name, model.graph.input[1].name
    train = np.load(workdir / "val.npz")
    np.savez(tmp_path / "named.npz", **{data_input: train["x"], label_input: train["y"]})
    proc = run_cli("eval", arts, "--data", tmp_path / "named.npz")
    assert proc.returncode == 0, proc.stderr
    np.savez(tmp_path / "named_y.npz", **{data_input: train["x"], "y": train["y"]})  # as with several inputs
    proc = run_cli("eval", arts, "--data", tmp_path / "named_y.npz")
    assert proc.returncode == 0, proc.stderr
    np.savez(tmp_path / "other.npz", pixels=train["x"], digits=train["y"])
    assert_one_line_error(run_cli("eval", arts, "--data", tmp_path / "other.npz"), "no array 'x'",
                          f"or the input named after the model's ({data_input!r}) and the labels as 'y' or "
                          f"{label_input!r}")


def _two_input_model() -> onnx.ModelProto:
    """A token classifier with two inputs, as a transformer's input_ids and attention_mask: the mean of the
    masked embeddings, then a linear layer, 3 classes; dynamic batch and sequence."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["vectors"]),
             helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["mask", "last"], ["mask3"]),
             helper.make_node("Mul", ["vectors", "mask3"], ["masked"]),
             helper.make_node("ReduceMean", ["masked"], ["pooled"], axes=[1], keepdims=0),
             helper.make_node("Gemm", ["pooled", "w", "b"], ["logits"], transB=1)]
    graph = helper.make_graph(
        nodes, "two_inputs",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(rng.normal(size=(20, 8)).astype(np.float32), "embedding"),
                     numpy_helper.from_array(rng.normal(size=(3, 8)).astype(np.float32) * 0.1, "w"),
                     numpy_helper.from_array(np.zeros(3, np.float32), "b"),
                     numpy_helper.from_array(np.array([-1], np.int64), "last")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_model_with_several_inputs_trains_from_arrays_named_after_them(tmp_path):
    """A transformer-like model (input_ids, attention_mask): the CLI used to refuse any model with more than one
    input ("drive such models from Python"); its dataset now holds one array per input, by name."""
    onnx.save(_two_input_model(), tmp_path / "model.onnx")
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 20, (96, 6)).astype(np.int64)
    mask = (rng.random((96, 6)) > 0.2).astype(np.int64)
    y = (ids[:, 0] % 3).astype(np.int64)   # learnable from the first token
    np.savez(tmp_path / "train.npz", input_ids=ids, attention_mask=mask, y=y)
    np.savez(tmp_path / "no_mask.npz", input_ids=ids, labels=y)
    assert run_cli("generate", tmp_path / "model.onnx", "-o", tmp_path / "a", "--loss", "cross-entropy",
                   "--optimizer", "adamw").returncode == 0
    proc = run_cli("train", tmp_path / "a", "--data", tmp_path / "train.npz", "--epochs", "3", "--lr", "0.05",
                   "--val-split", "0.25", "--progress", "plain")
    assert proc.returncode == 0, proc.stderr
    losses = [r["train_loss"] for r in _epochs(tmp_path / "a" / "run" / "metrics.jsonl")]
    assert len(losses) == 3 and losses[-1] < losses[0]
    proc = run_cli("eval", tmp_path / "a", "--data", tmp_path / "train.npz", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["examples"] == 96
    assert_one_line_error(run_cli("train", tmp_path / "a", "--data", tmp_path / "no_mask.npz", "--restart"),
                          "no array 'attention_mask'", "['input_ids', 'attention_mask']",
                          "np.savez('no_mask.npz', input_ids=..., attention_mask=..., labels=...)")


def test_a_metric_that_does_not_fit_the_task_is_named(tmp_path):
    """accuracy on a regression's float targets printed 0.0% every epoch; on multi-label targets it raised a
    numpy broadcasting error."""
    _save_linear(tmp_path / "multilabel.onnx", 3)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "ml.npz", x=rng.normal(size=(40, 4)).astype(np.float32),
             y=(rng.random((40, 3)) > 0.5).astype(np.float32))
    assert run_cli("generate", tmp_path / "multilabel.onnx", "-o", tmp_path / "a", "--loss", "bce-with-logits",
                   "--additional-outputs", "y").returncode == 0
    assert_one_line_error(run_cli("eval", tmp_path / "a", "--data", tmp_path / "ml.npz", "--metrics", "accuracy"),
                          "--metrics accuracy does not fit these artifacts", "float32 targets", "binary_accuracy")
    proc = run_cli("eval", tmp_path / "a", "--data", tmp_path / "ml.npz", "--metrics", "binary_accuracy")
    assert proc.returncode == 0 and "binary_accuracy" in proc.stdout, proc.stderr


def test_an_empty_file_is_not_taken_for_an_empty_model(tmp_path):
    """protobuf parses b"" as a ModelProto: `info` printed a model of 0 nodes and exited 0."""
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert_one_line_error(run_cli("info", tmp_path / "empty.onnx"), "is not an ONNX model: the file is empty")
    assert_one_line_error(run_cli("generate", tmp_path / "empty.onnx", "-o", tmp_path / "a", "--loss", "mse"),
                          "the file is empty")


def test_the_run_folder_given_for_the_artifacts_is_named(workdir, arts):
    """`info DIR/run` advised writing artifacts into the run folder with `generate`."""
    assert run_cli("train", arts, "--data", workdir / "train.npz", "--epochs", "1").returncode == 0
    assert_one_line_error(run_cli("info", arts / "run"), "is the run folder", "give the artifact folder itself")


def test_a_shape_with_a_part_that_is_no_number_is_refused():
    """`onnxtrain data --shape 3,x` reshaped to [3] (the "x" of WxH became an empty part, dropped silently)."""
    import argparse

    from onnxtrain.cli.datafile import _shape

    assert _shape("1,8,8") == (1, 8, 8) and _shape("28x28") == (28, 28) and _shape(" 2, 2") == (2, 2)
    for text in ("3,x", "1,,8", "8,"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected comma-separated integers"):
            _shape(text)
