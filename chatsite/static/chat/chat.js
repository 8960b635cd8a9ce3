// The chat page: one websocket, answers streamed from their Redis streams, resumed after a reconnect
// from the last event id each answer rendered (so no token is lost or shown twice).

const page = JSON.parse(document.getElementById("page-data").textContent);
const $ = (id) => document.getElementById(id);
const messagesEl = $("messages");
const answers = new Map(); // generation id -> answer state
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
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("rel", "noopener noreferrer nofollow");
    node.setAttribute("target", "_blank");
  }
});

function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(text, { gfm: true, breaks: false }), ANSWER_HTML);
}

function escapeHtml(text) {
  const div = document.createElement("div");
  div.textContent = text;
  return div.innerHTML;
}

function formatMetrics(m) {
  const parts = [];
  if (m.tokens_per_s != null) parts.push(`${m.tokens_per_s.toFixed(1)} tok/s`);
  if (m.ttft_ms != null) parts.push(`TTFT ${Math.round(m.ttft_ms)} ms`);
  if (m.acceptance_rate != null) parts.push(`acceptance ${(m.acceptance_rate * 100).toFixed(0)}%`);
  if (m.mean_accepted_length != null) parts.push(`${m.mean_accepted_length.toFixed(2)} tokens/step`);
  if (m.completion_tokens != null) parts.push(`${m.completion_tokens} tokens in ${m.main_steps} steps`);
  if (m.speculative_mode) {
    const k = m.speculative_k != null ? ` K=${m.speculative_k}` : "";
    parts.push(m.speculative_reason ? `speculation: ${m.speculative_mode}${k} (${m.speculative_reason})`
                                    : `speculation: ${m.speculative_mode}${k}`);
  }
  if (m.finish_reason) parts.push(`finish: ${m.finish_reason}`);
  return parts.join(" · ");
}

function addBubble(role) {
  const el = document.createElement("article");
  el.className = `message ${role}`;
  el.innerHTML = `<div class="body"></div><div class="meta"></div>`;
  messagesEl.appendChild(el);
  return el;
}

function addUserMessage(text) {
  const el = addBubble("user");
  el.querySelector(".body").textContent = text;
  scrollDown();
}

function scrollDown() {
  messagesEl.scrollTop = messagesEl.scrollHeight;
}

class Answer {
  constructor(el, messageId, generationId) {
    this.el = el;
    this.messageId = messageId;
    this.generationId = generationId;
    this.el.dataset.generation = generationId;
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
  }

  apply(id, event) {
    this.lastId = id;
    if (event.type === "start") {
      this.el.querySelector(".meta").textContent = `${event.prompt_tokens} prompt tokens · generating…`;
    } else if (event.type === "delta") {
      for (const step of event.steps) {
        this.steps.push(step);
        this.text += step[0] + step[1];
      }
      this.queueRender();
    } else if (event.type === "done") {
      this.text = event.text;
      this.finish(formatMetrics(event));
    } else if (event.type === "error") {
      this.finish("");
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
    this.el.querySelector(".meta").textContent = metrics;
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
    if ($("show-steps").checked && this.steps.length) {
      // One span per main step: the draft tokens it accepted, then the main model's own token.
      body.className = "body steps";
      body.innerHTML = this.steps
        .map((s, i) => `<span class="step" title="step ${i + 1}: ${s[0] ? "draft accepted" : "no draft token accepted"}">`
          + (s[0] ? `<span class="draft">${escapeHtml(s[0])}</span>` : "")
          + `<span class="main">${escapeHtml(s[1])}</span></span>`)
        .join("");
    } else {
      body.className = "body";
      body.innerHTML = renderMarkdown(this.text);
    }
    scrollDown();
  }

  addActions() {
    if (this.el.querySelector(".actions")) return;
    const actions = document.createElement("div");
    actions.className = "actions";
    const regen = document.createElement("button");
    regen.type = "button";
    regen.className = "regenerate link";
    regen.textContent = "regenerate";
    regen.addEventListener("click", () => {
      actions.remove();
      const ref = String(++refCounter);
      pendingRegenerate.set(ref, this);
      send({ action: "regenerate", message: this.messageId, settings: currentSettings(), ref });
    });
    actions.appendChild(regen);
    this.el.appendChild(actions);
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

function send(payload) {
  if (!socket || socket.readyState !== WebSocket.OPEN) {
    setStatus("Not connected; retrying…", true);
    return false;
  }
  socket.send(JSON.stringify(payload));
  return true;
}

function follow(answer) {
  send({ action: "follow", generation: answer.generationId, after: answer.lastId, steps: answer.steps.length });
}

function onMessage(msg) {
  if (msg.type === "started") {
    setStatus("");
    if (!conversationId) {
      conversationId = msg.conversation;
      history.replaceState(null, "", `/c/${conversationId}/`);
      const item = document.createElement("li");
      const link = document.createElement("a");
      link.href = `/c/${conversationId}/`;
      link.className = "current";
      link.textContent = (pendingSends.get(msg.ref) || "New chat").trim().slice(0, 80);
      item.appendChild(link);
      $("conversations").prepend(item);
    }
    if (pendingSends.has(msg.ref)) {
      addUserMessage(pendingSends.get(msg.ref));
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
      answer = new Answer(addBubble("assistant"), msg.message, msg.generation);
    }
    answers.set(msg.generation, answer);
    updateButtons();
  } else if (msg.type === "event") {
    const answer = answers.get(msg.generation);
    if (answer && !answer.done) answer.apply(msg.id, msg.event);
  } else if (msg.type === "error") {
    setStatus(msg.message, true);
    if (pendingSends.has(msg.ref)) {
      $("prompt").value = pendingSends.get(msg.ref); // nothing was saved: give the text back
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

function initPairs() {
  const select = $("pair");
  for (const pair of page.pairs) {
    const option = document.createElement("option");
    option.value = pair.slug;
    const mode = pair.draft_dir ? "draft" : pair.prompt_lookup ? "prompt lookup" : "no draft";
    option.textContent = `${pair.name} (${mode})`;
    select.appendChild(option);
  }
  select.value = page.pair;
  if (!page.pairs.length) setStatus("No pair is registered yet: add one in the admin.", true);
}

function initMessages() {
  for (const m of page.messages) {
    if (m.role === "user") {
      addUserMessage(m.text);
      continue;
    }
    const g = m.generation;
    const answer = new Answer(addBubble("assistant"), m.id, g ? g.id : "");
    if (!g) continue;
    answers.set(g.id, answer);
    if (g.done) {
      answer.steps = g.steps || [];
      answer.text = m.text;
      answer.finish(formatMetrics(g));
      if (g.error) answer.apply(answer.lastId, { type: "error", message: g.error });
    }
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value;
  if (!text.trim()) {
    setStatus("Type a message first.", true);
    return;
  }
  const ref = String(++refCounter);
  const payload = { action: "send", conversation: conversationId, pair: $("pair").value, text, settings: currentSettings(), ref };
  if (send(payload)) {
    pendingSends.set(ref, text);
    $("prompt").value = "";
  }
});

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

initPairs();
initMessages();
updateButtons();
connect();
