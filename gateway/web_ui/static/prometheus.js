// Prometheus' text format (what /metrics serves) read into samples, and the sums the server panel shows.

const SAMPLE = /^([A-Za-z_:][A-Za-z0-9_:]*)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)/;

// text -> [{name, labels: {...}, value}]
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = SAMPLE.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[2]) {
      for (const l of m[2].slice(1, -1).matchAll(/([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    }
    const value = m[3] === "+Inf" ? Infinity : m[3] === "-Inf" ? -Infinity : parseFloat(m[3]);
    samples.push({ name: m[1], labels, value });
  }
  return samples;
}

// The sum of a metric's samples (over models and workers); null when the server has none of it.
export function total(samples, name) {
  let sum = null;
  for (const s of samples) if (s.name === name) sum = (sum || 0) + s.value;
  return sum;
}
