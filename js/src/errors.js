// The error kinds of onnxtrain/errors.py that the JavaScript side raises (CheckpointError lives with the
// checkpoint format, src/checkpoint/format.js).

/** A feed given to a training or eval step has an unknown name, the wrong dtype or shape, a bad label, or a token
 * id outside the table it indexes. */
export class InputError extends Error {
  constructor(message) {
    super(message);
    this.name = 'InputError';
  }
}

/** A training, eval, optimizer or train-step model is unreadable, or does not belong with the others. */
export class ArtifactError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ArtifactError';
  }
}

/** The engine stopped while running a graph; the message names the step, the node's op type and what the engine
 * said. */
export class ExecutionError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ExecutionError';
  }
}
