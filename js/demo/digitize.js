// A drawing -> the 8x8 image scikit-learn's digits are made of, so the pretrained model sees what it knows.
//
// Those digits (UCI optdigits) are 32x32 binary bitmaps, the digit scaled to the full height and centred,
// divided into 4x4 blocks whose "on" pixels are counted: 8x8 values from 0 to 16. We do the same with the
// pen strokes: scale and centre them in 32x32, rasterize them with a pen about as thick as the data set's
// strokes, and count the blocks. Pure JavaScript (no canvas), so Node.js tests it too.

export const SIDE = 8;           // the model's image is SIDE x SIDE
export const BLOCK = 4;          // bitmap pixels per image pixel, per axis
export const MAX_VALUE = BLOCK * BLOCK;
const BITMAP = SIDE * BLOCK;     // 32
const PEN = 5;                   // pen width in bitmap pixels (a "0" in the data set is ~1 block thick)

/**
 * Rasterize strokes into a digits-style image.
 * @param {Array<Array<{x: number, y: number}>>} strokes pen strokes in any coordinates (e.g. canvas pixels)
 * @returns {Float32Array | null} SIDE*SIDE row-major counts in 0..MAX_VALUE, or null for an empty drawing
 */
export function digitize(strokes) {
  const points = strokes.flat();
  if (points.length === 0) return null;
  const xs = points.map((p) => p.x);
  const ys = points.map((p) => p.y);
  const [left, right, top, bottom] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  // The longer side of the ink spans the bitmap (the pen's half width stays inside); a dot stays a dot.
  const scale = (BITMAP - PEN) / Math.max(right - left, bottom - top, 1e-6);
  const cx = (left + right) / 2;
  const cy = (top + bottom) / 2;
  const to = (p) => ({ x: BITMAP / 2 + (p.x - cx) * scale, y: BITMAP / 2 + (p.y - cy) * scale });
  const segments = [];
  for (const stroke of strokes) {
    const mapped = stroke.map(to);
    for (let i = 0; i < mapped.length; i++) segments.push([mapped[Math.max(i - 1, 0)], mapped[i]]);
  }
  const image = new Float32Array(SIDE * SIDE);
  const radius2 = (PEN / 2) ** 2;
  for (let row = 0; row < BITMAP; row++) {
    for (let col = 0; col < BITMAP; col++) {
      const p = { x: col + 0.5, y: row + 0.5 };
      if (segments.some(([a, b]) => distance2(p, a, b) <= radius2)) {
        image[Math.floor(row / BLOCK) * SIDE + Math.floor(col / BLOCK)] += 1;
      }
    }
  }
  return image;
}

/** Squared distance from point p to the segment a-b. */
function distance2(p, a, b) {
  const dx = b.x - a.x;
  const dy = b.y - a.y;
  const length2 = dx * dx + dy * dy;
  const t = length2 === 0 ? 0 : Math.max(0, Math.min(1, ((p.x - a.x) * dx + (p.y - a.y) * dy) / length2));
  const ex = a.x + t * dx - p.x;
  const ey = a.y + t * dy - p.y;
  return ex * ex + ey * ey;
}
