// Turning an answer into HTML and its metrics into words. It holds no state of the page, so any of the
// chat's modules may import it (a module runs once: the sanitiser's hooks below are added once). It needs
// only the vendor globals (marked, DOMPurify, hljs) that the template's classic scripts define before any
// module runs.

// Model output is attacker-influenced (prompt injection): only plain formatting survives. No style,
// no forms or inputs, no id/name/class that could stand in for the page's own elements, nothing that
// loads from elsewhere (images, frames, svg), links only to http(s) and mailto, opened apart from the chat.
const ANSWER_HTML = {
  ALLOWED_TAGS: ["p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "b", "i", "del", "s", "sup",
                 "sub", "kbd", "code", "pre", "blockquote", "ul", "ol", "li", "a", "table", "thead", "tbody", "tr",
                 "th", "td"],
  ALLOWED_ATTR: ["href", "title", "start", "align"],
  ALLOWED_URI_REGEXP: /^(?:https?|mailto):/i,
  ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false,
};
// The highlighter's output is made from a code block's text alone, and sanitised again all the same:
// spans whose only attribute is one of highlight.js's own token classes.
const HIGHLIGHT_HTML = { ALLOWED_TAGS: ["span"], ALLOWED_ATTR: ["class"], ALLOW_DATA_ATTR: false, ALLOW_ARIA_ATTR: false };
const HLJS_CLASS = /^hljs-[a-z-]+(?: [a-z]+_*)*$/;
DOMPurify.addHook("uponSanitizeAttribute", (node, data) => {
  if (data.attrName === "class" && !HLJS_CLASS.test(data.attrValue)) data.keepAttr = false;
});
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("rel", "noopener noreferrer nofollow");
    node.setAttribute("target", "_blank");
  }
});
const AUTO_LANGUAGES = ["python", "javascript", "typescript", "java", "c", "cpp", "csharp", "go", "rust", "bash",
                        "sql", "json", "yaml", "xml", "css", "ruby", "php", "kotlin", "swift", "diff"];

// HTML the model wrote is shown as the text it is, never parsed: an inline handler or style in it must
// meet no HTML parser of this page's (a document DOMParser makes shares the page's policy, and Chromium
// reports what that policy blocks there); the Content-Security-Policy is the second line, DOMPurify the
// third. A chat shows what a model says about HTML, tags included. An image would load from wherever the
// model points: it is a link to it instead. A line break (<br>, which models put in table cells) is the
// one tag kept: the page writes its own. Each fenced block's language is carried to the sanitised page
// in the <pre>'s title (an attribute the sanitiser keeps; it is read and removed before the block is shown).
marked.use({
  renderer: {
    html({ text, block }) {
      if (/^<br\s*\/?>$/i.test(text.trim())) return "<br>";
      return block ? `<p>${escapeHtml(text.trim())}</p>\n` : escapeHtml(text);
    },
    image({ href, text }) {
      return `<a href="${escapeHtml(href)}">${escapeHtml(text || href)}</a>`;
    },
    code({ text, lang }) {
      const language = (lang || "").trim().split(/\s+/)[0];
      return `<pre title="${escapeHtml(language)}"><code>${escapeHtml(text)}</code></pre>\n`;
    },
  },
});

export function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(text, { gfm: true, breaks: false }), ANSWER_HTML);
}

// Text made safe to place in HTML, without a document: a string in, a string out.
const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

export const plural = (n, word) => `${n} ${n === 1 ? word : `${word}s`}`;

function highlighted(text, language) {
  const result = hljs.getLanguage(language)
    ? hljs.highlight(text, { language, ignoreIllegals: true })
    : hljs.highlightAuto(text, AUTO_LANGUAGES);
  return { html: DOMPurify.sanitize(result.value, HIGHLIGHT_HTML), language: result.language || "" };
}

// Code blocks (already sanitised <pre><code>) get highlighting, a language label and a copy button.
export function decorateCode(body, cache) {
  for (const pre of body.querySelectorAll("pre")) {
    const code = pre.querySelector("code") || pre;
    const asked = pre.getAttribute("title") || "";
    pre.removeAttribute("title");
    const text = code.textContent;
    const key = `${asked}\u0000${text}`;
    if (!cache.has(key)) cache.set(key, highlighted(text, asked));
    const { html, language } = cache.get(key);
    code.innerHTML = html;
    code.classList.add("hljs");
    const block = document.createElement("div");
    block.className = "code-block";
    const tools = document.createElement("div");
    tools.className = "code-tools";
    const label = document.createElement("span");
    label.className = "code-language";
    label.textContent = hljs.getLanguage(asked) ? language : "code"; // a guessed language is not named
    tools.append(label, copyButton("Copy", "copy-code", "Copy this code"));
    pre.replaceWith(block);
    block.append(tools, pre);
  }
}

// Show steps: the rendered answer (Markdown, highlighting and all) coloured by the step that wrote each
// character: the draft tokens the main accepted, then the main model's own token, with a mark where each
// step begins. Each character shown is found again in the answer's own text, in order (rendering only
// drops characters, the Markdown syntax, and adds a few line breaks), so only text nodes are wrapped.
// `text` is what the steps wrote, after `offset` characters of prompt (a completion pair's).
export function markSteps(body, text, steps, offset = 0) {
  const writer = new Array(offset).fill(null); // for each character of text: [step, "draft" | "main"]
  steps.forEach(([draft, main], i) => {
    writer.push(...Array(draft.length).fill([i, "draft"]), ...Array(main.length).fill([i, "main"]));
  });
  const walker = document.createTreeWalker(body, NodeFilter.SHOW_TEXT, {
    acceptNode: (node) => (node.parentElement.closest(".code-tools") ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT),
  });
  const nodes = [];
  while (walker.nextNode()) nodes.push(walker.currentNode);
  let position = 0;
  let lastStep = -1;
  for (const node of nodes) {
    const shown = node.data;
    const runs = []; // [start, end, writer]
    for (let i = 0; i < shown.length; i++) {
      let found = null;
      if (/\s/.test(shown[i])) { // a space the rendering may have added (between blocks, table cells)
        if (/\s/.test(text[position] ?? "")) found = writer[position++] ?? null;
      } else {
        const at = text.indexOf(shown[i], position);
        if (at !== -1 && at - position < 400) { // not found nearby: a character the rendering added
          found = writer[at] ?? null;
          position = at + 1;
        }
      }
      const last = runs.at(-1);
      if (last && last[2] === found) last[1] = i + 1;
      else runs.push([i, i + 1, found]);
    }
    if (runs.every((run) => run[2] === null)) continue;
    const pieces = document.createDocumentFragment();
    for (const [start, end, found] of runs) {
      const piece = shown.slice(start, end);
      if (found === null) {
        pieces.append(piece);
        continue;
      }
      const [step, kind] = found;
      const span = document.createElement("span");
      span.className = step !== lastStep ? `${kind} step-start` : kind;
      span.title = `step ${step + 1}: ${kind === "draft" ? "draft tokens the main accepted" : "the main model's own token"}`;
      span.textContent = piece;
      pieces.append(span);
      lastStep = step;
    }
    node.replaceWith(pieces);
  }
}

export function copyButton(text, className, title) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = `${className} link`;
  button.textContent = text;
  button.title = title;
  return button;
}

export async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // Plain http on another host has no clipboard API: the old way, through a selection.
    const holder = document.createElement("pre");
    holder.className = "copy-holder";
    holder.textContent = text;
    document.body.appendChild(holder);
    const range = document.createRange();
    range.selectNodeContents(holder);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    document.execCommand("copy");
    getSelection().removeAllRanges();
    holder.remove();
  }
  const original = button.textContent;
  button.textContent = "Copied";
  button.classList.add("copied");
  setTimeout(() => {
    button.textContent = original;
    button.classList.remove("copied");
  }, 1500);
}

// ------------------------------------------------------------------ the metrics line, in words
// Read from the plan's reason codes (serving/reasons.py, Reason), never from its sentence.
const LOAD_CODES = ["profile-best-k", "live-k-fastest", "joins-speculative-batch", "exploring-speculation"];
const DEFAULT_CODES = ["pair-default-k", "pair-default-k-invalid-profile"];
const BUSY_CODES = ["beyond-own-streams", "profile-main-alone-faster", "own-batch", "joins-main-alone-batch"];
const SLOWER_CODES = ["calibrated-main-alone-faster", "live-main-alone-faster", "live-neither-faster"];

function speculationWords(m) {
  const codes = m.speculative_reason_codes || [];
  const because = (...wanted) => wanted.some((code) => codes.includes(code));
  if (m.speculative_mode === "off" || !m.speculative_mode) {
    if (because("asked-off")) return "draft off, as asked";
    if (because("no-draft")) return "no draft model";
    if (because(...BUSY_CODES)) return "the main model alone: more of this pair's answers were running here";
    if (because(...SLOWER_CODES)) return "the main model alone: faster than speculation on this host";
    return m.speculative_mode ? "the main model alone was chosen" : "";
  }
  if (because("calibrated-long-context-lookup")) return "guesses from the conversation: after a prompt this long the draft does not pay here";
  if (m.speculative_mode === "prompt-lookup") return "guesses from the conversation, no draft model";
  if (m.speculative_k == null) return "draft while confident";
  if (codes.lastIndexOf("left-batch") > codes.lastIndexOf("moved-into-batch")) {
    return `K=${m.speculative_k} (again once the other answers ended)`;
  }
  if (because("moved-into-batch")) {
    // The own engine moved it into one batch with the pair's other answers: the K it ran at there, not the planned one.
    return m.speculative_k ? `K=${m.speculative_k} (in a batch as more answers came)`
      : "the main model alone: in a batch as more answers came";
  }
  if (because("k-asked")) return `K=${m.speculative_k} (asked)`;
  if (because(...LOAD_CODES)) return `K=${m.speculative_k} (for the load)`;
  if (because(...DEFAULT_CODES)) return `K=${m.speculative_k} (default)`;
  return `K=${m.speculative_k}`;
}

// An ended answer's figures in words a newcomer reads without hovering (touch has none), in two short lines: the
// wait for its first token, then how fast it wrote (tokens/s after that first token: the wait is a figure of its
// own, and the one rate every figure here uses); then how that compares with the pair's main model alone on this
// host, as the host's calibration timed it (the admin quotes the same figure), and what speculation did. The why
// and the full figures are the `details`, a tap away.
export function formatMetrics(m, pair) {
  const figures = [];
  const writing = writingRate(m);
  if (m.ttft_ms != null) figures.push(`first token ${formatMs(m.ttft_ms)}`);
  if (writing) figures.push(`${writing.toFixed(1)} tokens/s`);
  if (m.completion_tokens != null) figures.push(plural(m.completion_tokens, "token"));
  if (m.finish_reason === "stopped") figures.push("stopped");
  else if (m.finish_reason === "repeating") figures.push("stopped: it was repeating itself");
  else if (m.finish_reason === "length") figures.push("reached the max tokens");
  const alone = pair?.main_alone_tokens_per_s;
  const guessed = m.speculative_mode && m.speculative_mode !== "off"; // the main alone is 1× itself, whatever noise says
  const copying = m.speculative_mode === "prompt-lookup";
  const ratio = writing && alone && guessed ? writing / alone : null;
  const how = [];
  if (ratio) how.push(`${ratio.toFixed(1)}× the main alone`);
  how.push(speculationWords(m));
  if (m.acceptance_rate != null && m.main_steps && m.completion_tokens) {
    how.push(`${Math.round(m.acceptance_rate * 100)}% of guesses kept`);
  }
  return { summary: [figures.join(" · "), how.filter(Boolean).join(" · ")].filter(Boolean).join("\n"),
           details: [explanation(m, ratio, copying), m.speculative_reason ? `Why: ${m.speculative_reason}.` : "",
                     technicalMetrics(m, writing)].filter(Boolean).join("\n") };
}

function explanation(m, ratio, copying) {
  const how = copying
    ? "The next words are guessed from the conversation and the main model checks several at once."
    : "A small draft model guesses the next words and the main model checks several guesses at once.";
  const lines = [];
  if (m.speculative_mode && m.speculative_mode !== "off") lines.push(how);
  if (ratio != null && ratio < 1.05) {
    lines.push(`This answer wrote at ${ratio.toFixed(1)}× the speed the main model alone had when this host was `
      + "measured: checking guesses costs time, and the machine may be busier now. A guess kept often is not always "
      + "a faster answer.");
  }
  if (m.acceptance_rate != null && m.main_steps && m.completion_tokens) {
    lines.push(`The main model ran ${plural(m.main_steps, "step")} for ${plural(m.completion_tokens, "token")}.`
      + (m.ngram_accepted_tokens && !copying
        ? ` ${m.ngram_accepted_tokens} of the tokens kept were copied from the conversation.` : "")
      + (m.undrafted_steps ? ` For ${plural(m.undrafted_steps, "step")} nothing was guessed: where guesses did not `
        + "pay, the main model went on alone." : ""));
  }
  return lines.join(" ");
}

// Tokens per second once the first token was out: None for an answer of one token (no time to divide).
export function writingRate(m) {
  const seconds = (m.duration_ms - (m.ttft_ms ?? 0)) / 1000;
  return m.completion_tokens > 1 && seconds > 0 ? (m.completion_tokens - 1) / seconds : null;
}

function formatMs(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}

function technicalMetrics(m, writing) {
  const parts = [];
  if (writing != null) parts.push(`${writing.toFixed(1)} tok/s after the first token`);
  if (m.ttft_ms != null) parts.push(`first token after ${Math.round(m.ttft_ms)} ms`);
  if (m.acceptance_rate != null) parts.push(`acceptance ${(m.acceptance_rate * 100).toFixed(0)}%`);
  if (m.mean_accepted_length != null) parts.push(`${m.mean_accepted_length.toFixed(2)} tokens/step`);
  if (m.ngram_draft_tokens) {
    parts.push(`n-gram lookup: ${m.ngram_accepted_tokens} of ${m.ngram_draft_tokens} kept`);
    if (m.draft_tokens > m.ngram_draft_tokens) {
      parts.push(`draft model: ${m.accepted_tokens - m.ngram_accepted_tokens} of ${m.draft_tokens - m.ngram_draft_tokens} kept`);
    }
  }
  if (m.undrafted_steps) parts.push(`${plural(m.undrafted_steps, "step")} without proposals (drafters sat out)`);
  if (m.completion_tokens != null) parts.push(`${plural(m.completion_tokens, "token")} in ${plural(m.main_steps, "main step")}`);
  if (m.speculative_mode) parts.push(`speculation: ${m.speculative_mode}${m.speculative_k != null ? ` K=${m.speculative_k}` : ""}`);
  if (m.finish_reason) parts.push(`finish: ${m.finish_reason}`);
  return parts.join(" · ");
}
