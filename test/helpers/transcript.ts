// Terminal transcripts in Markdown: the fenced blocks of the docs that show `$ command` lines followed by what the
// command printed. The docs test runs every command and compares its output with the block, so an example in the
// docs cannot go stale.

export interface TranscriptStep {
  command: string;
  /** The lines the docs show after the command, up to the next command or the block's end. */
  expected: string[];
}

export interface Transcript {
  /** Where the block starts (1-based line of the opening fence), for the test's name and failures. */
  line: number;
  steps: TranscriptStep[];
}

const FENCE = /^(\s*)(```+|~~~+)(.*)$/;

/** Every fenced block whose first non-blank line is a `$ ` command. Blocks of commands without `$ ` (```sh) are
 * illustrations (gs:// URLs, placeholders) and are not transcripts. */
export function transcripts(markdown: string): Transcript[] {
  const lines = markdown.split("\n");
  const out: Transcript[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = FENCE.exec(lines[i] ?? "");
    if (!open) continue;
    const fence = open[2] ?? "```";
    const start = i;
    const body: string[] = [];
    for (i++; i < lines.length && !(lines[i] ?? "").trimStart().startsWith(fence); i++) body.push(lines[i] ?? "");
    const first = body.findIndex((l) => l.trim() !== "");
    if (first < 0 || !body[first]?.startsWith("$ ")) continue;
    const steps: TranscriptStep[] = [];
    for (const l of body.slice(first)) {
      if (l.startsWith("$ ")) steps.push({ command: l.slice(2), expected: [] });
      else steps[steps.length - 1]?.expected.push(l);
    }
    for (const s of steps) while (s.expected.length > 0 && s.expected[s.expected.length - 1]?.trim() === "") s.expected.pop();
    out.push({ line: start + 1, steps });
  }
  return out;
}

// Times, rates and sizes change from run to run and machine to machine; counts do not, so only a number followed
// by a unit is masked.
const MEASURE = /\d+(?:[.,]\d+)*\s?(?:MB\/s|GB\/s|ms|s|B|KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB|%)(?![A-Za-z])/g;

// The commit a build reports (`--version`) is the one under test, not the one the docs were written at.
const COMMIT = /\(commit [0-9a-f]{12}, (?:clean|dirty)\)/g;

export function mask(line: string): string {
  return line.replace(COMMIT, "(commit <commit>)").replace(MEASURE, "<measure>").trimEnd();
}

/** Compares printed lines with the docs' lines: measures masked, a line `…` in the docs stands for one or more
 * printed lines. Returns null when they agree, else the first difference. */
export function compareOutput(expected: string[], actual: string[]): string | null {
  const want = expected.map(mask);
  const got = actual.map(mask);
  while (got.length > 0 && got[got.length - 1] === "") got.pop();
  const match = (w: number, g: number): boolean => {
    if (w === want.length) return g === got.length;
    if (want[w]?.trim() === "…") {
      for (let k = g + 1; k <= got.length; k++) if (match(w + 1, k)) return true;
      return false;
    }
    return g < got.length && want[w] === got[g] && match(w + 1, g + 1);
  };
  if (match(0, 0)) return null;
  // Where they part: each line of the docs in turn, found at the next printed line (anywhere later after a `…`).
  let g = 0;
  let skipping = false;
  for (const [w, line] of want.entries()) {
    if (line.trim() === "…") {
      skipping = true;
      g++;
      continue;
    }
    const at = skipping ? got.indexOf(line, g) : got[g] === line ? g : -1;
    if (at < 0)
      return `line ${w + 1}: the docs show\n  ${line}\nthe command printed${skipping ? ` nothing like it after line ${g}` : `\n  ${got[g] ?? "(nothing)"}`}`;
    g = at + 1;
    skipping = false;
  }
  return `the docs show ${want.length} lines, the command printed ${got.length}`;
}
