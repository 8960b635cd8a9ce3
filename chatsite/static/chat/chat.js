// The chat page: one websocket, answers streamed from their Redis streams, resumed after a reconnect
// from the last event id each answer rendered (so no token is lost or shown twice). Conversation
// management (rename, delete, system prompt, edit and resend) goes over small JSON POSTs.

const page = JSON.parse(document.getElementById("page-data").textContent);
const $ = (id) => document.getElementById(id);
const messagesEl = $("messages");
const answers = new Map(); // generation id -> answer state
const pairs = new Map(page.pairs.map((p) => [p.slug, p]));
const csrfToken = document.querySelector("input[name=csrfmiddlewaretoken]").value;
let conversationId = page.conversation;
let socket = null;
let retryMs = 250;
let refCounter = 0;

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

// Each fenced block's language, carried to the sanitised page in the <pre>'s title (an attribute the
// sanitiser keeps; it is read and removed before the block is shown).
marked.use({
  renderer: {
    code({ text, lang }) {
      const language = (lang || "").trim().split(/\s+/)[0];
      return `<pre title="${escapeHtml(language)}"><code>${escapeHtml(text)}</code></pre>\n`;
    },
  },
});

function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(text, { gfm: true, breaks: false }), ANSWER_HTML);
}

function escapeHtml(text) {
  const div = document.createElement("div");
  div.textContent = text;
  return div.innerHTML.replaceAll('"', "&quot;");
}

const plural = (n, word) => `${n} ${n === 1 ? word : `${word}s`}`;

function highlighted(text, language) {
  const result = hljs.getLanguage(language)
    ? hljs.highlight(text, { language, ignoreIllegals: true })
    : hljs.highlightAuto(text, AUTO_LANGUAGES);
  return { html: DOMPurify.sanitize(result.value, HIGHLIGHT_HTML), language: result.language || "" };
}

// Code blocks (already sanitised <pre><code>) get highlighting, a language label and a copy button.
function decorateCode(body, cache) {
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

function copyButton(text, className, title) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = `${className} link`;
  button.textContent = text;
  button.title = title;
  return button;
}

async function copyText(text, button) {
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

messagesEl.addEventListener("click", (e) => {
  const button = e.target.closest("button");
  if (!button) return;
  if (button.classList.contains("copy-code")) {
    copyText(button.closest(".code-block").querySelector("code, pre").textContent, button);
  } else if (button.classList.contains("copy-answer")) {
    const answer = [...answers.values()].find((a) => a.el === button.closest("article"));
    if (answer) copyText(answer.shownText(), button);
  }
});

// ------------------------------------------------------------------ the metrics line, in words
function speculationWords(m) {
  const reason = m.speculative_reason || "";
  const load = reason.match(/(\d+) running here/);
  if (m.speculative_mode === "off" || !m.speculative_mode) {
    if (reason.startsWith("speculative: false")) return "draft off, as asked";
    if (reason.includes("no draft")) return "no draft model";
    return m.speculative_mode ? "the main model alone was chosen" : "";
  }
  if (m.speculative_mode === "prompt-lookup") return "drafts from the prompt's own words";
  if (m.speculative_k == null) return "draft while confident";
  if (reason.includes("asked")) return `K=${m.speculative_k}, as asked`;
  if (load) return `K=${m.speculative_k} chosen for ${plural(Number(load[1]), "stream")}`;
  if (reason.includes("default")) return `K=${m.speculative_k}, the pair's default`;
  return `K=${m.speculative_k}`;
}

function formatMetrics(m) {
  const parts = [];
  if (m.completion_tokens != null) {
    parts.push(plural(m.completion_tokens, "token") + (m.tokens_per_s != null ? ` at ${m.tokens_per_s.toFixed(1)} tokens/s` : ""));
  }
  if (m.main_steps && m.completion_tokens && m.acceptance_rate != null) {
    parts.push(`${(m.completion_tokens / m.main_steps).toFixed(1)}x fewer main-model steps`);
  }
  if (m.acceptance_rate != null) parts.push(`${Math.round(m.acceptance_rate * 100)}% of draft tokens accepted`);
  const speculation = speculationWords(m);
  if (speculation) parts.push(speculation);
  if (m.finish_reason === "stopped") parts.push("stopped");
  else if (m.finish_reason === "length") parts.push("reached the max tokens");
  return parts.join(" · ");
}

function technicalMetrics(m) {
  const parts = [];
  if (m.tokens_per_s != null) parts.push(`${m.tokens_per_s.toFixed(1)} tok/s`);
  if (m.ttft_ms != null) parts.push(`first token after ${Math.round(m.ttft_ms)} ms`);
  if (m.acceptance_rate != null) parts.push(`acceptance ${(m.acceptance_rate * 100).toFixed(0)}%`);
  if (m.mean_accepted_length != null) parts.push(`${m.mean_accepted_length.toFixed(2)} tokens/step`);
  if (m.completion_tokens != null) parts.push(`${plural(m.completion_tokens, "token")} in ${plural(m.main_steps, "main step")}`);
  if (m.speculative_mode) {
    const k = m.speculative_k != null ? ` K=${m.speculative_k}` : "";
    parts.push(`speculation: ${m.speculative_mode}${k}${m.speculative_reason ? ` (${m.speculative_reason})` : ""}`);
  }
  if (m.finish_reason) parts.push(`finish: ${m.finish_reason}`);
  return parts.join("\n");
}

// ------------------------------------------------------------------ messages
function addBubble(role) {
  const el = document.createElement("article");
  el.className = `message ${role}`;
  el.innerHTML = `<div class="body"></div><div class="meta"></div>`;
  messagesEl.appendChild(el);
  showEmptyState();
  return el;
}

function addUserMessage(text) {
  const el = addBubble("user");
  el.querySelector(".body").textContent = text;
  updateActions();
  scrollDown();
}

function scrollDown() {
  messagesEl.scrollTop = messagesEl.scrollHeight;
}

class Answer {
  constructor(el, messageId, generationId, pairSlug) {
    this.el = el;
    this.messageId = messageId;
    this.generationId = generationId;
    this.pair = pairs.get(pairSlug);
    this.el.dataset.generation = generationId;
    this.highlights = new Map(); // code text -> its highlighted HTML, so streaming re-renders stay cheap
    this.reset();
  }

  reset() {
    this.lastId = "0-0";
    this.steps = [];
    this.text = "";
    this.done = false;
    this.renderQueued = false;
    this.el.classList.add("streaming");
    this.el.querySelector(".meta").textContent = "waiting for the worker…";
    this.el.querySelector(".meta").title = "";
    this.el.querySelector(".actions")?.remove();
  }

  // A completion pair continues the user's text: the answer is shown after its prompt, as one block.
  prompt() {
    const user = this.el.previousElementSibling;
    return this.pair?.completes_text && user?.classList.contains("user") ? user.querySelector(".body").textContent : null;
  }

  shownText() {
    const prompt = this.prompt();
    return prompt == null ? this.text : prompt + this.text;
  }

  apply(id, event) {
    this.lastId = id;
    if (event.type === "start") {
      this.el.querySelector(".meta").textContent = `${plural(event.prompt_tokens, "prompt token")} · writing…`;
    } else if (event.type === "delta") {
      for (const step of event.steps) {
        this.steps.push(step);
        this.text += step[0] + step[1];
      }
      this.queueRender();
    } else if (event.type === "done") {
      this.text = event.text;
      this.finish(event);
    } else if (event.type === "error") {
      this.finish(null);
      const err = document.createElement("p");
      err.className = "error";
      err.textContent = event.message;
      this.el.querySelector(".body").appendChild(err);
    }
  }

  finish(metrics) {
    this.done = true;
    this.el.classList.remove("streaming");
    this.render();
    const meta = this.el.querySelector(".meta");
    meta.textContent = metrics ? formatMetrics(metrics) : "";
    meta.title = metrics ? technicalMetrics(metrics) : "";
    this.addActions();
    updateButtons();
  }

  queueRender() {
    if (this.renderQueued) return;
    this.renderQueued = true;
    requestAnimationFrame(() => {
      this.renderQueued = false;
      this.render();
    });
  }

  render() {
    const body = this.el.querySelector(".body");
    const prompt = this.prompt();
    if ($("show-steps").checked && this.steps.length) {
      // One span per main step: the draft tokens it accepted, then the main model's own token.
      body.className = "body steps";
      body.innerHTML = (prompt == null ? "" : escapeHtml(prompt)) + this.steps
        .map((s, i) => `<span class="step" title="step ${i + 1}: ${s[0] ? "draft accepted" : "no draft token accepted"}">`
          + (s[0] ? `<span class="draft">${escapeHtml(s[0])}</span>` : "")
          + `<span class="main">${escapeHtml(s[1])}</span></span>`)
        .join("");
    } else if (prompt != null) {
      body.className = "body";
      body.innerHTML = "<pre><code></code></pre>";
      body.querySelector("code").textContent = prompt + this.text;
      decorateCode(body, this.highlights);
    } else {
      body.className = "body";
      body.innerHTML = renderMarkdown(this.text);
      decorateCode(body, this.highlights);
    }
    scrollDown();
  }

  addActions() {
    if (this.el.querySelector(".actions")) return;
    const actions = document.createElement("div");
    actions.className = "actions";
    const regen = copyButton("Regenerate", "regenerate", "Write this answer again");
    regen.addEventListener("click", () => {
      actions.remove();
      const ref = String(++refCounter);
      pendingRegenerate.set(ref, this);
      send({ action: "regenerate", message: this.messageId, settings: currentSettings(), ref });
    });
    actions.append(copyButton("Copy", "copy-answer", "Copy the whole answer"), regen);
    this.el.appendChild(actions);
    updateActions();
  }
}

const pendingRegenerate = new Map(); // ref -> the answer being regenerated
const pendingSends = new Map(); // ref -> the text sent, shown once the server accepted it

function inFlight() {
  return [...answers.values()].filter((a) => !a.done);
}

function updateButtons() {
  const busy = inFlight().length > 0;
  $("stop").disabled = !busy;
  $("send").disabled = busy;
  $("stop").hidden = !busy; // one button where the other was: Stop while an answer is written
  $("send").hidden = busy;
  updateActions();
}

// Regenerate only under the last answer, edit only on the last message sent: where they work.
function updateActions() {
  const articles = [...messagesEl.querySelectorAll("article.message")];
  const lastAnswer = articles.findLast((a) => a.classList.contains("assistant"));
  for (const button of messagesEl.querySelectorAll("button.regenerate")) {
    button.hidden = button.closest("article") !== lastAnswer || articles.at(-1) !== lastAnswer;
  }
  const lastUser = articles.findLast((a) => a.classList.contains("user"));
  messagesEl.querySelectorAll("article.user .actions").forEach((el) => {
    if (el.closest("article") !== lastUser) el.remove();
  });
  if (lastUser && !lastUser.querySelector(".actions") && !lastUser.classList.contains("editing")) {
    const actions = document.createElement("div");
    actions.className = "actions";
    const edit = copyButton("Edit", "edit", "Edit this message and send it again");
    edit.addEventListener("click", () => startEdit(lastUser));
    actions.appendChild(edit);
    lastUser.appendChild(actions);
  }
  const busy = inFlight().length > 0 || !conversationId;
  messagesEl.querySelectorAll("article.user button.edit").forEach((b) => { b.disabled = busy; });
}

function setStatus(text, isError = false) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

function currentSettings() {
  const num = (id) => ($(id).value === "" ? null : Number($(id).value));
  const settings = {
    max_tokens: num("max-tokens"),
    temperature: num("temperature") ?? 0,
    speculative: $("speculative").checked,
  };
  if (num("k") !== null) settings.num_assistant_tokens = num("k");
  if (num("threshold") !== null) settings.assistant_confidence_threshold = num("threshold");
  return settings;
}

// Checked here, with the pair's own cap, before anything is sent; the server checks again.
function settingsProblem() {
  for (const input of $("composer").querySelectorAll("input[type=number]")) {
    if (!input.checkValidity()) {
      const name = input.closest("label").textContent.trim();
      if (input.validity.rangeOverflow) return `${name} is at most ${input.max}${input.id === "max-tokens" ? " for this pair" : ""}.`;
      if (input.validity.rangeUnderflow) return `${name} is at least ${input.min}.`;
      return `${name}: ${input.validationMessage}`;
    }
  }
  return "";
}

function send(payload) {
  if (!socket || socket.readyState !== WebSocket.OPEN) {
    setStatus("Not connected; retrying…", true);
    return false;
  }
  socket.send(JSON.stringify(payload));
  return true;
}

async function post(url, body) {
  const response = await fetch(url, {
    method: "POST", headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken },
    body: JSON.stringify(body), credentials: "same-origin",
  });
  const data = await response.json().catch(() => ({ error: { message: `The server answered ${response.status}.` } }));
  if (data.error) throw new Error(data.error.message);
  return data;
}

function follow(answer) {
  send({ action: "follow", generation: answer.generationId, after: answer.lastId, steps: answer.steps.length });
}

function listConversation(id, title) {
  document.querySelectorAll("#conversations a.current").forEach((a) => {
    a.classList.remove("current");
    a.removeAttribute("aria-current");
  });
  let link = document.querySelector(`#conversations a[data-id="${id}"]`);
  if (!link) {
    const item = document.createElement("li");
    link = document.createElement("a");
    link.href = `/c/${id}/`;
    link.dataset.id = id;
    item.appendChild(link);
    $("conversations").prepend(item);
  }
  link.className = "current";
  link.setAttribute("aria-current", "page");
  link.textContent = title;
}

function enterConversation(id, title) {
  conversationId = id;
  history.replaceState(null, "", `/c/${id}/`);
  listConversation(id, title);
  setTitle(title);
  $("rename").hidden = $("delete").hidden = $("export").hidden = false;
  $("export-md").href = `/c/${id}/export.md`;
  $("export-json").href = `/c/${id}/export.json`;
}

function setTitle(title) {
  $("conversation-title").textContent = title;
  document.title = `${title} · SpecChat`;
}

function onMessage(msg) {
  if (msg.type === "started") {
    setStatus("");
    const sent = pendingSends.get(msg.ref);
    if (conversationId !== msg.conversation || !document.querySelector(`#conversations a[data-id="${msg.conversation}"]`)) {
      enterConversation(msg.conversation, sent ? sent.text.split(/\s+/).join(" ").trim().slice(0, 80) : "New chat");
    }
    if (sent) {
      addUserMessage(sent.text);
      pendingSends.delete(msg.ref);
    }
    let answer = pendingRegenerate.get(msg.ref);
    pendingRegenerate.delete(msg.ref);
    if (answer) {
      answers.delete(answer.generationId);
      answer.generationId = msg.generation;
      answer.el.dataset.generation = msg.generation;
      answer.reset();
    } else {
      answer = new Answer(addBubble("assistant"), msg.message, msg.generation, sent ? sent.pair : $("pair").value);
    }
    answers.set(msg.generation, answer);
    updateButtons();
  } else if (msg.type === "event") {
    const answer = answers.get(msg.generation);
    if (answer && !answer.done) answer.apply(msg.id, msg.event);
  } else if (msg.type === "error") {
    setStatus(msg.message, true);
    if (pendingSends.has(msg.ref)) {
      $("prompt").value = pendingSends.get(msg.ref).text; // nothing was saved: give the text back
      pendingSends.delete(msg.ref);
    }
    const answer = pendingRegenerate.get(msg.ref);
    if (answer) {
      pendingRegenerate.delete(msg.ref);
      answer.addActions();
    }
    updateButtons();
  }
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  socket = new WebSocket(`${scheme}://${location.host}/ws/chat/`);
  socket.addEventListener("open", () => {
    retryMs = 250;
    setStatus("");
    document.body.dataset.connected = "1";
    inFlight().forEach(follow); // resume each answer after the last event it rendered
  });
  socket.addEventListener("message", (e) => onMessage(JSON.parse(e.data)));
  socket.addEventListener("close", (e) => {
    document.body.dataset.connected = "";
    if (e.code === 4401) {
      location.href = "/accounts/login/?next=" + encodeURIComponent(location.pathname);
      return;
    }
    setStatus("Connection lost; reconnecting…", true);
    setTimeout(connect, retryMs);
    retryMs = Math.min(retryMs * 2, 5000);
  });
}

// ------------------------------------------------------------------ pairs and the empty state
const UNSERVED = "No worker serves this pair now. Start everything with <code>make run</code> (or <code>python manage.py "
  + "serve</code>), or ask an admin to load it: Admin → Model pairs → select it → “Load on every live worker”.";

function initPairs() {
  const select = $("pair");
  for (const pair of page.pairs) {
    const option = document.createElement("option");
    option.value = pair.slug;
    option.textContent = `${pair.name} (${pair.mode})${pair.served === false ? " — not served now" : ""}`;
    if (pair.description) option.title = pair.description;
    select.appendChild(option);
  }
  select.value = page.pair;
  select.addEventListener("change", showPair);
  if (!page.pairs.length) setStatus("No pair is registered yet: an admin adds one in Admin → Model pairs.", true);
  showPair();
}

function showPair() {
  const pair = pairs.get($("pair").value);
  const maxTokens = $("max-tokens");
  if (pair) {
    maxTokens.max = pair.max_new_tokens_cap;
    if (Number(maxTokens.value) > pair.max_new_tokens_cap) maxTokens.value = pair.max_new_tokens_cap;
    $("k").placeholder = pair.num_assistant_tokens ? `auto (${pair.num_assistant_tokens})` : "auto";
  }
  $("pair-description").textContent = pair ? pair.description : "";
  showEmptyState();
  $("empty-pair").textContent = pair ? pair.name : "No pair yet";
  $("empty-description").textContent = pair
    ? pair.description || "Ask something: answers stream in as the main model checks the draft's guesses."
    : "An admin registers a pair in Admin → Model pairs (or `python manage.py register_demo_pair`).";
  $("empty-unavailable").hidden = !(pair && pair.served === false);
  $("empty-unavailable").innerHTML = UNSERVED; // the page's own words, no model output
  $("prompt").placeholder = pair && pair.completes_text ? "def quicksort(numbers):" : "Message";
}

function showEmptyState() {
  $("empty").hidden = messagesEl.querySelector("article.message") !== null;
  $("pair-description").hidden = !$("empty").hidden; // said once: in the empty state, else under the composer
}

function initMessages() {
  let previousPair = page.pair;
  for (const m of page.messages) {
    if (m.role === "user") {
      addUserMessage(m.text);
      continue;
    }
    const g = m.generation;
    const answer = new Answer(addBubble("assistant"), m.id, g ? g.id : "", g ? g.pair : previousPair);
    if (!g) continue;
    previousPair = g.pair;
    answers.set(g.id, answer);
    if (g.done) {
      answer.steps = g.steps || [];
      answer.text = m.text;
      answer.finish(g);
      if (g.error) answer.apply(answer.lastId, { type: "error", message: g.error });
    }
  }
  showEmptyState();
  updateActions();
}

// ------------------------------------------------------------------ sending, editing
$("composer").addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = $("prompt").value;
  if (!text.trim()) {
    setStatus("Type a message first.", true);
    return;
  }
  const problem = settingsProblem();
  if (problem) {
    setStatus(problem, true);
    return;
  }
  const system = $("system-prompt").value.trim();
  if (!conversationId && system) {
    try { // the system prompt is kept before the first message is sent
      const made = await post("/c/new/", { system_prompt: system });
      conversationId = made.conversation;
    } catch (err) {
      setStatus(err.message, true);
      return;
    }
  }
  const ref = String(++refCounter);
  const pair = $("pair").value;
  const payload = { action: "send", conversation: conversationId, pair, text, settings: currentSettings(), ref };
  if (send(payload)) {
    pendingSends.set(ref, { text, pair });
    $("prompt").value = "";
  }
});

function startEdit(article) {
  const body = article.querySelector(".body");
  const original = body.textContent;
  article.classList.add("editing");
  article.querySelector(".actions")?.remove();
  const form = document.createElement("form");
  form.className = "edit-form";
  const label = document.createElement("label");
  label.className = "visually-hidden";
  label.htmlFor = "edit-text";
  label.textContent = "Edit your message";
  const area = document.createElement("textarea");
  area.id = "edit-text";
  area.value = original;
  area.rows = Math.min(12, original.split("\n").length + 1);
  const save = copyButton("Save and send", "save-edit", "Send the edited message; the answers after it are replaced");
  save.type = "submit";
  save.classList.remove("link");
  const cancel = copyButton("Cancel", "cancel-edit", "Keep the message as it was");
  form.append(label, area, save, cancel);
  body.hidden = true;
  article.insertBefore(form, body);
  area.focus();
  const close = () => {
    form.remove();
    body.hidden = false;
    article.classList.remove("editing");
    updateActions();
  };
  cancel.addEventListener("click", close);
  area.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) form.requestSubmit();
  });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const problem = area.value.trim() ? settingsProblem() : "Type a message first.";
    if (problem) {
      setStatus(problem, true);
      return;
    }
    save.disabled = true;
    try {
      const started = await post(`/c/${conversationId}/edit/`, { text: area.value, settings: currentSettings() });
      while (article.nextElementSibling) { // the answers after the message leave with it
        const next = article.nextElementSibling;
        for (const [id, a] of answers) if (a.el === next) answers.delete(id);
        next.remove();
      }
      body.textContent = area.value;
      close();
      setStatus("");
      const answer = new Answer(addBubble("assistant"), started.message, started.generation, $("pair").value);
      answers.set(started.generation, answer);
      updateButtons();
      follow(answer);
    } catch (err) {
      save.disabled = false;
      setStatus(err.message, true);
    }
  });
}

$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("composer").requestSubmit();
});

$("stop").addEventListener("click", () => {
  inFlight().forEach((a) => send({ action: "stop", generation: a.generationId }));
});

$("show-steps").addEventListener("change", () => {
  $("legend").hidden = !$("show-steps").checked;
  answers.forEach((a) => a.render());
});

// ------------------------------------------------------------------ conversation management
$("rename").addEventListener("click", () => {
  $("rename-input").value = $("conversation-title").textContent;
  $("rename-form").hidden = false;
  $("conversation-title").hidden = true;
  $("rename-input").select();
});

function closeRename() {
  $("rename-form").hidden = true;
  $("conversation-title").hidden = false;
}

$("rename-cancel").addEventListener("click", closeRename);
$("rename-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  try {
    const { title } = await post(`/c/${conversationId}/rename/`, { title: $("rename-input").value });
    setTitle(title);
    listConversation(conversationId, title);
    closeRename();
  } catch (err) {
    setStatus(err.message, true);
  }
});

$("delete").addEventListener("click", async () => {
  if (!confirm(`Delete “${$("conversation-title").textContent}”? This cannot be undone.`)) return;
  try {
    await post(`/c/${conversationId}/delete/`, {});
    location.href = "/";
  } catch (err) {
    setStatus(err.message, true);
  }
});

$("system-prompt").value = page.system_prompt;
$("system-toggle").addEventListener("click", () => {
  const box = $("system-box");
  box.hidden = !box.hidden;
  $("system-toggle").setAttribute("aria-expanded", String(!box.hidden));
  if (!box.hidden) $("system-prompt").focus();
});
$("system-box").addEventListener("submit", async (e) => {
  e.preventDefault();
  if (!conversationId) { // a new chat keeps it with its first message
    $("system-state").textContent = "Kept for this chat's first message.";
    return;
  }
  try {
    const saved = await post(`/c/${conversationId}/system/`, { system_prompt: $("system-prompt").value });
    $("system-prompt").value = saved.system_prompt;
    $("system-state").textContent = "Saved: used from the next answer on.";
  } catch (err) {
    $("system-state").textContent = "";
    setStatus(err.message, true);
  }
});
$("system-toggle").classList.toggle("set", Boolean(page.system_prompt));

$("search").addEventListener("input", () => {
  const words = $("search").value.toLowerCase().split(/\s+/).filter(Boolean);
  let shown = 0;
  for (const link of document.querySelectorAll("#conversations a")) {
    const match = words.every((w) => link.textContent.toLowerCase().includes(w));
    link.parentElement.hidden = !match;
    shown += match;
  }
  $("no-match").hidden = shown > 0;
});

function setSidebar(open) {
  $("app").classList.toggle("sidebar-open", open);
  $("backdrop").hidden = !open;
  $("sidebar-toggle").setAttribute("aria-expanded", String(open));
}
$("sidebar-toggle").addEventListener("click", () => setSidebar(!$("app").classList.contains("sidebar-open")));
$("backdrop").addEventListener("click", () => setSidebar(false));
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape") setSidebar(false);
});

initPairs();
initMessages();
updateButtons();
connect();
