// The web demo's page (served by `onnxtrain web-demo`): draw digits, label them, train the pretrained model's
// classifier head on them with onnxtrain's TrainingSession on onnxruntime-web, download the checkpoint.
// window.webDemo exposes the examples and the last run's numbers (the browser test reads them).

import * as ort from 'onnxruntime-web';
import { bindEngine, readSafetensors } from '/js/src/index.js';
import { digitize, SIDE, MAX_VALUE } from '/js/demo/digitize.js';

// One thread: the head is small, and one thread gives the same numbers on every run.
ort.env.wasm.numThreads = 1;
const { TrainingSession } = bindEngine(ort);
const PIXELS = SIDE * SIDE;
const BATCH = 32;                       // more examples than this train in shuffled minibatches
const $ = (id) => document.getElementById(id);

const demo = {
  meta: null, names: {}, session: null, initialCheckpoint: null, heldout: null, replay: null,
  strokes: [], examples: [], losses: [], lastRun: null, busy: false, ready: false, error: null,
};
window.webDemo = {
  get ready() { return demo.ready; },
  get error() { return demo.error; },
  get busy() { return demo.busy; },
  examples: () => demo.examples.map((e) => ({ pixels: Array.from(e.pixels), label: e.label })),
  get lastRun() { return demo.lastRun; },
  get losses() { return [...demo.losses]; },
};

// onnxruntime-web runs one call at a time per session: every session call goes through this queue.
let queue = Promise.resolve();
function serialized(call) {
  const result = queue.then(call);
  queue = result.catch(() => {});
  return result;
}

async function fetchBytes(path) {
  const response = await fetch(path);
  if (!response.ok) throw new Error(`GET ${path}: HTTP ${response.status} (is \`onnxtrain web-demo\` still running?)`);
  return new Uint8Array(await response.arrayBuffer());
}

async function openSession(checkpoint) {
  // train_step_model.onnx: the training and optimizer graphs fused (one session run per step).
  const files = ['training_model.onnx', 'eval_model.onnx', 'optimizer_model.onnx', 'train_step_model.onnx'];
  const [trainModel, evalModel, optimizerModel, trainStepModel] = await Promise.all(
    files.map((f) => fetchBytes(`/artifacts/${f}`)));
  // A copy: the session's state must not alias the pristine bytes "back to pretrained" reloads.
  const session = await TrainingSession.create({
    checkpointState: checkpoint.slice(), trainModel, evalModel, optimizerModel, trainStepModel });
  session.setLearningRate(Number($('lr').value));
  // The artifacts name their inputs (image, labels) and outputs (loss, logits).
  [demo.names.input, demo.names.labels] = session.trainingInputNames;
  demo.names.output = session.trainingOutputNames[1];
  return session;
}

/** Feeds for n images (n*PIXELS values in the data set's 0..16 scale, divided by 16 as in training). */
function feeds(images, labels) {
  const n = labels.length;
  const x = new Float32Array(n * PIXELS);
  for (let i = 0; i < x.length; i++) x[i] = images[i] / MAX_VALUE;
  return {
    [demo.names.input]: new ort.Tensor('float32', x, [n, 1, SIDE, SIDE]),
    [demo.names.labels]: new ort.Tensor('int64', BigInt64Array.from(labels, BigInt), [n]),
  };
}

/** Predicted class and its softmax probability for each image, with the eval model. */
async function predict(images, n) {
  const outputs = await serialized(() => demo.session.runEvalStep(feeds(images, new Array(n).fill(0))));
  const logits = outputs[demo.names.output].data;
  const classes = demo.meta.classes;
  const result = [];
  for (let i = 0; i < n; i++) {
    const row = logits.subarray(i * classes, (i + 1) * classes);
    const best = row.indexOf(Math.max(...row));
    const sum = row.reduce((s, v) => s + Math.exp(v - row[best]), 0);
    result.push({ label: best, probability: 1 / sum });
  }
  return result;
}

async function accuracy(images, labels) {
  if (labels.length === 0) return null;
  const predictions = await predict(images, labels.length);
  return predictions.filter((p, i) => p.label === Number(labels[i])).length / labels.length;
}

function exampleImages(examples) {
  const images = new Float32Array(examples.length * PIXELS);
  examples.forEach((e, i) => images.set(e.pixels, i * PIXELS));
  return images;
}

async function measure() {
  const examples = demo.examples;
  return {
    examples: await accuracy(exampleImages(examples), examples.map((e) => e.label)),
    heldout: await accuracy(demo.heldout.x, demo.heldout.y),
  };
}

// -- drawing -------------------------------------------------------------------------------------------------
const pad = $('pad');
const ink = pad.getContext('2d');

function setupPad() {
  ink.lineWidth = 18;
  ink.lineCap = ink.lineJoin = 'round';
  let stroke = null;
  const point = (event) => {
    const box = pad.getBoundingClientRect();
    return { x: (event.clientX - box.left) * (pad.width / box.width), y: (event.clientY - box.top) * (pad.height / box.height) };
  };
  pad.addEventListener('pointerdown', (event) => {
    pad.setPointerCapture(event.pointerId);
    stroke = [point(event)];
    demo.strokes.push(stroke);
    drawStroke(stroke);
  });
  pad.addEventListener('pointermove', (event) => {
    if (!stroke) return;
    stroke.push(point(event));
    drawStroke(stroke);
  });
  const end = () => {
    if (!stroke) return;
    stroke = null;
    reported(showGuess)();
  };
  pad.addEventListener('pointerup', end);
  pad.addEventListener('pointercancel', end);
}

function drawStroke(stroke) {
  ink.beginPath();
  const from = stroke[Math.max(stroke.length - 2, 0)];
  const to = stroke[stroke.length - 1];
  ink.moveTo(from.x, from.y);
  ink.lineTo(to.x + 0.01, to.y);       // a zero-length line would draw nothing for a dot
  ink.stroke();
}

function clearPad() {
  demo.strokes = [];
  ink.clearRect(0, 0, pad.width, pad.height);
  drawImage($('preview'), null);
  $('guess').textContent = "the model's guess appears here";
  delete $('guess').dataset.strokes;
}

/** An 8x8 image (0..16) on a small canvas, dark ink on white; empty for null. */
function drawImage(canvas, pixels) {
  const context = canvas.getContext('2d');
  const cell = canvas.width / SIDE;
  context.fillStyle = '#fff';
  context.fillRect(0, 0, canvas.width, canvas.height);
  if (!pixels) return;
  for (let i = 0; i < PIXELS; i++) {
    const shade = Math.round(255 * (1 - pixels[i] / MAX_VALUE));
    context.fillStyle = `rgb(${shade},${shade},${shade})`;
    context.fillRect((i % SIDE) * cell, Math.floor(i / SIDE) * cell, cell, cell);
  }
}

async function showGuess() {
  const pixels = digitize(demo.strokes);
  drawImage($('preview'), pixels);
  if (!pixels || demo.busy || !demo.ready) return;
  const [strokes, count] = [demo.strokes, demo.strokes.length];
  const [guess] = await predict(pixels, 1);
  if (demo.strokes !== strokes || strokes.length !== count) return;   // drawn on or cleared meanwhile
  $('guess').textContent = `the model reads ${guess.label} (${Math.round(100 * guess.probability)}%)`;
  $('guess').dataset.strokes = String(count);
}

// -- examples ------------------------------------------------------------------------------------------------
function addExample(label) {
  const pixels = digitize(demo.strokes);
  if (!pixels) {
    setStatus('draw a digit first, then press its label');
    return;
  }
  demo.examples.push({ pixels, label });
  clearPad();
  reported(renderExamples)();
}

async function renderExamples() {
  const box = $('examples');
  box.replaceChildren();
  $('count').textContent = `(${demo.examples.length})`;
  $('personalize').disabled = demo.busy || demo.examples.length === 0;
  if (demo.examples.length === 0) return;
  const guesses = await predict(exampleImages(demo.examples), demo.examples.length);
  demo.examples.forEach((example, i) => {
    const item = document.createElement('div');
    item.className = 'example';
    item.title = 'click to remove';
    const canvas = document.createElement('canvas');
    canvas.width = canvas.height = 32;
    drawImage(canvas, example.pixels);
    const caption = document.createElement('span');
    const right = guesses[i].label === example.label;
    caption.className = right ? 'right' : 'wrong';
    caption.textContent = `${example.label} → ${guesses[i].label}`;
    item.append(canvas, caption);
    item.addEventListener('click', () => {
      if (demo.busy) return;
      demo.examples.splice(i, 1);
      reported(renderExamples)();
    });
    box.append(item);
  });
}

// -- training ------------------------------------------------------------------------------------------------
// A seeded generator (mulberry32): the same drawings and settings train the same way every time.
let seed = 0;
function random() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}

function shuffled(n) {
  const order = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  return order;
}

async function personalize() {
  const steps = Number($('steps').value);
  const learningRate = Number($('lr').value);
  if (!(Number.isInteger(steps) && steps >= 1) || !(learningRate > 0)) {
    setStatus(`steps must be a whole number from 1 and the learning rate a positive number (got ${$('steps').value} ` +
      `and ${$('lr').value})`);
    return;
  }
  setBusy(true);
  try {
    demo.session.setLearningRate(learningRate);
    const examples = [...demo.examples];
    const before = await measure();
    showAccuracy('before', before);
    showAccuracy('after', { examples: null, heldout: null });
    demo.losses = [];
    seed = 0;
    const started = performance.now();
    const fusedBefore = demo.session.module.fusedCalls;
    let order = [];
    for (let step = 0; step < steps; step++) {
      if (order.length < Math.min(BATCH, examples.length)) order = shuffled(examples.length);
      const batch = order.splice(0, Math.min(BATCH, examples.length)).map((i) => examples[i]);
      // Pre-training digits ride along in every step, so the head learns this writer without forgetting the rest.
      batch.push(...shuffled(demo.replay.length).slice(0, demo.meta.replay_batch).map((i) => demo.replay[i]));
      const { loss } = await serialized(async () => {
        const outputs = await demo.session.runTrainStep(feeds(exampleImages(batch), batch.map((e) => e.label)));
        await demo.session.runOptimizerStep();
        await demo.session.lazyResetGrad();
        return outputs;
      });
      demo.losses.push(Number(loss.data[0]));
      $('progress').value = (step + 1) / steps;
      $('progress-text').textContent = `step ${step + 1} / ${steps}, loss ${demo.losses.at(-1).toFixed(3)}`;
      drawLosses();
      await new Promise((resolve) => setTimeout(resolve, 0));   // let the page repaint
    }
    const seconds = (performance.now() - started) / 1000;
    const after = await measure();
    showAccuracy('after', after);
    demo.lastRun = { steps, learningRate, examples: examples.length, before, after, losses: [...demo.losses], seconds,
      fusedSteps: demo.session.module.fusedCalls - fusedBefore };
    setStatus(`trained ${steps} steps on ${examples.length} examples in ${seconds.toFixed(1)} s`);
  } finally {
    await renderExamples().finally(() => setBusy(false));
  }
}

function drawLosses() {
  const canvas = $('loss');
  const context = canvas.getContext('2d');
  const losses = demo.losses;
  const [width, height, margin] = [canvas.width, canvas.height, 18];
  context.clearRect(0, 0, width, height);
  context.fillStyle = '#555';
  context.font = '11px system-ui, sans-serif';
  const top = Math.max(...losses, 1e-6);
  context.fillText(`loss (max ${top.toFixed(2)})`, 4, 12);
  context.fillText(`${losses.length} steps`, width - 60, height - 4);
  context.strokeStyle = '#1f6fd1';
  context.lineWidth = 2;
  context.beginPath();
  losses.forEach((loss, i) => {
    const x = margin + (i / Math.max(losses.length - 1, 1)) * (width - 2 * margin);
    const y = height - margin - (loss / top) * (height - 2 * margin);
    if (i === 0) context.moveTo(x, y); else context.lineTo(x, y);
  });
  context.stroke();
}

const percent = (value) => (value === null ? '–' : `${(100 * value).toFixed(1)}%`);

function showAccuracy(column, { examples, heldout }) {
  $(`examples-${column}`).textContent = percent(examples);
  $(`heldout-${column}`).textContent = percent(heldout);
}

async function reset() {
  setBusy(true);
  try {
    await serialized(async () => {
      await demo.session.release();
      demo.session = await openSession(demo.initialCheckpoint);
    });
    demo.lastRun = null;
    demo.losses = [];
    drawLosses();
    showAccuracy('before', { examples: null, heldout: null });
    showAccuracy('after', { examples: null, heldout: null });
    $('progress').value = 0;
    $('progress-text').textContent = '';
    $('download').disabled = true;
    setStatus('back to the pretrained model');
  } finally {
    await renderExamples().finally(() => setBusy(false));
  }
}

async function download() {
  const bytes = await serialized(() => demo.session.saveCheckpoint(undefined, true));
  const url = URL.createObjectURL(new Blob([bytes], { type: 'application/octet-stream' }));
  const link = Object.assign(document.createElement('a'), { href: url, download: 'personalized.ckpt' });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}

// -- page ----------------------------------------------------------------------------------------------------
function setStatus(text) {
  $('status').textContent = text;
}

/** A click handler that shows its failure on the page instead of losing it in the console. */
function reported(handler) {
  return () => handler().catch((error) => {
    demo.error = String(error?.message ?? error);
    setStatus(`error: ${demo.error}`);
    console.error(error);
  });
}

function setBusy(busy) {
  demo.busy = busy;
  $('reset').disabled = busy;
  $('personalize').disabled = busy || demo.examples.length === 0;
  $('download').disabled = busy || demo.lastRun === null;
}

/** Digits written by `onnxtrain web-demo` ({x: [n,1,8,8] in 0..1, y: [n]}) as 0..16 images and labels. */
async function loadDigits(file, what) {
  const tensors = readSafetensors(await fetchBytes(`/artifacts/${file}`), what).tensors;
  return { x: tensors.get('x').data.map((v) => v * MAX_VALUE), y: Array.from(tensors.get('y').data, Number) };
}

async function main() {
  demo.meta = JSON.parse(new TextDecoder().decode(await fetchBytes('/artifacts/demo.json')));
  $('steps').value = demo.meta.steps;
  $('lr').value = demo.meta.learning_rate;
  demo.heldout = await loadDigits('heldout.safetensors', 'held-out digits');
  const replay = await loadDigits('replay.safetensors', 'replay digits');
  demo.replay = replay.y.map((label, i) => ({ pixels: replay.x.subarray(i * PIXELS, (i + 1) * PIXELS), label }));
  $('heldout-name').textContent = `${demo.heldout.y.length} held-out digits`;
  demo.initialCheckpoint = await fetchBytes('/artifacts/checkpoint');
  demo.session = await openSession(demo.initialCheckpoint);
  for (let d = 0; d < demo.meta.classes; d++) {
    const button = Object.assign(document.createElement('button'), { textContent: String(d) });
    button.addEventListener('click', () => addExample(d));
    $('labels').append(button);
  }
  setupPad();
  clearPad();
  $('clear').addEventListener('click', clearPad);
  $('personalize').addEventListener('click', reported(personalize));
  $('reset').addEventListener('click', reported(reset));
  $('download').addEventListener('click', reported(download));
  const pretrained = await accuracy(demo.heldout.x, demo.heldout.y);
  setStatus(`pretrained model loaded: ${percent(pretrained)} on ${demo.heldout.y.length} held-out digits of the ` +
    'data set. Draw, label, personalize.');
  demo.ready = true;
  setBusy(false);
}

main().catch((error) => {
  demo.error = String(error?.message ?? error);
  setStatus(`error: ${demo.error}`);
  console.error(error);
});
