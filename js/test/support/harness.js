// Shared by the Node.js tests and the browser page: train one case of tests/js/reference.py with a bound API
// and compare with Python's results. `load(path)` returns a file's bytes (fs in Node.js, fetch in a browser).

import { loadCheckpoint, readSafetensors, CheckpointState } from '../../src/index.js';

/** max |a - b| / max |b| over one tensor (relative to the tensor's scale; 0 for identical tensors). */
export function relativeError(actual, expected) {
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < expected.length; i++) {
    diff = Math.max(diff, Math.abs(actual[i] - expected[i]));
    scale = Math.max(scale, Math.abs(expected[i]));
  }
  return scale === 0 ? diff : diff / scale;
}

/** The worst relative error over every trainable parameter, optimizer state and buffer of `state` vs a checkpoint's. */
export function compareWithCheckpoint(state, expectedBytes) {
  const expected = loadCheckpoint(expectedBytes, 'expected checkpoint');
  const data = state.toData(true);
  let worst = 0;
  for (const [name, t] of expected.trainable) worst = Math.max(worst, relativeError(data.trainable.get(name).data, t.data));
  for (const [name, states] of expected.optimizer) {
    for (const [s, t] of states) worst = Math.max(worst, relativeError(data.optimizer.get(name).get(s).data, t.data));
  }
  for (const [name, t] of expected.buffers) worst = Math.max(worst, relativeError(data.buffers.get(name).data, t.data));
  return { worst, stepJs: data.step, stepPy: expected.step };
}

/**
 * `ort` with every session's run() counted: `runs.total`, and per session (in creation order) its output
 * names and count. The tests use it to see which graphs a training step ran.
 */
export function countingEngine(ort) {
  const runs = { total: 0, sessions: [] };
  const create = async (...args) => {
    const session = await ort.InferenceSession.create(...args);
    const entry = { outputNames: [...session.outputNames], count: 0 };
    runs.sessions.push(entry);
    const run = session.run.bind(session);
    session.run = (...runArgs) => {
      entry.count += 1;
      runs.total += 1;
      return run(...runArgs);
    };
    return session;
  };
  return { engine: { ...ort, InferenceSession: { create } }, runs };
}

/**
 * Train case `name` (info from cases.json) from `dir` with `bind` (bindEngine) and `ort`; `checkpoint` and
 * `first` start from a mid-training checkpoint (the resume test); `fused` passes the train-step model.
 * Returns losses, eval results, session runs per step and the agreement with Python.
 */
export async function runCase(bind, ort, load, dir, info, { checkpoint = `${dir}/checkpoint`, first = 0, fused = true } = {}) {
  const { engine, runs } = countingEngine(ort);
  const api = bind(engine);
  const data = readSafetensors(await load(`${dir}/data.safetensors`), 'data').tensors;
  const reference = readSafetensors(await load(`${dir}/reference.safetensors`), 'reference').tensors;
  const session = await api.TrainingSession.create({
    checkpointState: await load(checkpoint),
    trainModel: await load(`${dir}/training_model.onnx`),
    evalModel: await load(`${dir}/eval_model.onnx`),
    optimizerModel: await load(`${dir}/optimizer_model.onnx`),
    trainStepModel: fused ? await load(`${dir}/train_step_model.onnx`) : undefined,
  });
  session.setLearningRate(info.lr);
  const feed = (i) => {
    const x = data.get(`x/${i}`);
    const y = data.get(`y/${i}`);
    return { [info.input]: new ort.Tensor('float32', x.data, x.shape), labels: new ort.Tensor('int64', y.data, y.shape) };
  };
  const losses = [];
  const started = performance.now();
  for (let i = first; i < info.steps; i++) {
    const outputs = await session.runTrainStep(feed(i));
    losses.push(Number(outputs.loss.data[0]));
    await session.runOptimizerStep();
    await session.lazyResetGrad();
  }
  const stepMs = (performance.now() - started) / (info.steps - first);
  const runsPerStep = runs.total / (info.steps - first);
  const evaluated = await session.runEvalStep(feed(info.steps));
  const pyLosses = Array.from(reference.get('losses').data).slice(first);
  const result = {
    losses,
    stepMs,
    runsPerStep,
    lossError: Math.max(...losses.map((l, i) => Math.abs(l - pyLosses[i]) / Math.abs(pyLosses[i]))),
    evalLossError: relativeError(evaluated.loss.data, reference.get('eval/loss').data),
    evalOutputError: relativeError(evaluated[info.output].data, reference.get('eval/output').data),
    ...compareWithCheckpoint(session.checkpointState, await load(`${dir}/expected.ckpt`)),
    checkpoint: await session.saveCheckpoint(undefined, true),
    parametersSize: await session.getParametersSize(true),
    names: [session.trainingInputNames, session.trainingOutputNames, session.evalInputNames, session.evalOutputNames],
  };
  await session.release();
  return result;
}

export { CheckpointState };

/**
 * Step time (train step + optimizer step + reset) in ms with the train-step model (`fused`: one session run)
 * and without it (`separate`: the training and optimizer graphs), both sessions in this process and their
 * rounds alternating, so both see the same load and the same compiled WebAssembly. Each session first runs
 * `warmup` steps; then `rounds` rounds of `steps` steps each; the figures are medians over the rounds, and
 * `ratio` the median of the per-round fused / separate ratios.
 */
export async function benchPair(api, load, dir, info, { warmup = 20, rounds = 7, steps = 10 } = {}) {
  const { ort } = api;
  const data = readSafetensors(await load(`${dir}/data.safetensors`), 'data').tensors;
  const files = {
    checkpointState: await load(`${dir}/checkpoint`), trainModel: await load(`${dir}/training_model.onnx`),
    optimizerModel: await load(`${dir}/optimizer_model.onnx`),
  };
  const sessions = {
    separate: await api.TrainingSession.create({ ...files, checkpointState: files.checkpointState.slice() }),
    fused: await api.TrainingSession.create({ ...files, trainStepModel: await load(`${dir}/train_step_model.onnx`) }),
  };
  const x = data.get('x/0');
  const y = data.get('y/0');
  const feeds = { [info.input]: new ort.Tensor('float32', x.data, x.shape), labels: new ort.Tensor('int64', y.data, y.shape) };
  const train = async (session, n) => {
    const started = performance.now();
    for (let i = 0; i < n; i++) {
      await session.runTrainStep(feeds);
      await session.runOptimizerStep();
      await session.lazyResetGrad();
    }
    return (performance.now() - started) / n;
  };
  for (const session of Object.values(sessions)) {
    session.setLearningRate(info.lr);
    await train(session, warmup);
  }
  const times = { separate: [], fused: [] };
  for (let round = 0; round < rounds; round++) {
    for (const [name, session] of Object.entries(sessions)) times[name].push(await train(session, steps));
  }
  for (const session of Object.values(sessions)) await session.release();
  const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
  return { separate: median(times.separate), fused: median(times.fused),
    ratio: median(times.fused.map((t, i) => t / times.separate[i])) };
}
