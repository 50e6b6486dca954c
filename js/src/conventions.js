// Names shared by the artifacts and the runtime: the same contract as onnxtrain/conventions.py.

export const LAZY_RESET_GRAD = 'lazy_reset_grad';
export const LEARNING_RATE = 'learning_rate';
export const STEP = 'step';
export const PARAMS = 'params';
export const GRADIENTS = 'gradients';
export const GRADIENTS_FINITE = 'gradients_finite'; // optimizer output: false when a gradient is NaN or infinite

export const gradBufferName = (param) => `${param}_grad.accumulation.buffer`;
export const gradOutputName = (param) => `${param}_grad.accumulation.out`;
export const bufferOutputName = (buffer) => `${buffer}.updated`;
export const outputName = (name) => `${name}.out`;
