// The chat page: one websocket, answers streamed from their Redis streams, resumed after a reconnect
// from the last event id each answer rendered (so no token is lost or shown twice). Conversation
// management (rename, delete, system prompt, edit and resend) goes over small JSON POSTs.
// This module keeps the page's state (the socket, the answers, the current conversation); the modules it
// imports hold no state of it and are handed what they need, so none of them imports this one.

import { Answer } from "./answer.js";
import { initConversations, listConversation, post, setTitle } from "./conversations.js";
import { currentSettings, initPairs, settingsProblem, showEmptyState } from "./pairs.js";
import { copyButton, copyText } from "./render.js";
import { inPlainWords } from "./words.js";

const page = JSON.parse(document.getElementById("page-data").textContent);
const $ = (id) => document.getElementById(id);
const messagesEl = $("messages");
const answers = new Map(); // generation id -> answer state
const pairs = new Map(page.pairs.map((p) => [p.slug, p]));
let conversationId = page.conversation;
let socket = null;
let retryMs = 250;
let refCounter = 0;
let connectionLost = false; // the status says so

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

// A panel opening (options, system prompt) or a phone's keyboard shrinks the list: one that was read at
// its end stays at its end, so the last answer's Copy and Regenerate do not slip under the composer.
// (Judged with the height it had: by the time the observer runs, the browser may have scrolled it a bit.)
let shownHeight = messagesEl.clientHeight;
new ResizeObserver(() => {
  if (messagesEl.scrollHeight - messagesEl.scrollTop - shownHeight < 40) scrollDown();
  shownHeight = messagesEl.clientHeight;
}).observe(messagesEl);

function addAnswer(messageId, generationId, pairSlug) {
  return new Answer(addBubble("assistant"), messageId, generationId, pairs.get(pairSlug), chatForAnswers);
}

// An answer whose prompt left out the conversation's oldest messages says so above its text.
function showLeftOut(answer, count) {
  answer.el.querySelector(".left-out")?.remove();
  if (!count) return;
  const note = document.createElement("p");
  note.className = "left-out";
  note.textContent = `${count === 1 ? "The oldest message was" : `The ${count} oldest messages were`} left out: `
    + "the conversation is longer than the model can read.";
  answer.el.insertBefore(note, answer.el.querySelector(".body"));
}

// What an answer asks of the page around it: handed to each, so that answer.js never imports this module.
const chatForAnswers = {
  showSteps: () => $("show-steps").checked,
  scrollDown,
  finished: updateButtons,
  actionsShown() {
    updateActions();
    scrollDown(); // the answer's buttons, in view
  },
  regenerate(answer) {
    if (busy()) {
      setStatus(ONE_AT_A_TIME, true);
      answer.addActions();
      return;
    }
    const ref = String(++refCounter);
    pendingRegenerate.set(ref, answer);
    send({ action: "regenerate", message: answer.messageId, settings: currentSettings(), ref });
    updateButtons();
  },
};

const pendingRegenerate = new Map(); // ref -> the answer being regenerated
const pendingSends = new Map(); // ref -> the text sent, shown once the server accepted it
let starting = false; // a send or an edit on its way (a new chat made first, an edit's POST)
const ONE_AT_A_TIME = "An answer is still being written: wait for it to finish, or stop it (Esc).";

function inFlight() {
  return [...answers.values()].filter((a) => !a.done);
}

// A conversation writes one answer at a time, so each answer's prompt holds the one before it (the server
// refuses a second one too, for another tab's sake): while one is written or asked for, Send is Stop.
function busy() {
  return starting || inFlight().length > 0 || pendingSends.size > 0 || pendingRegenerate.size > 0;
}

function updateButtons() {
  const answering = busy();
  const hadFocus = document.activeElement === $("send") || document.activeElement === $("stop");
  $("stop").disabled = !answering;
  $("send").disabled = answering;
  $("stop").hidden = !answering; // one button where the other was
  $("send").hidden = answering;
  if (hadFocus) $(answering ? "stop" : "send").focus(); // the button took the other's place: so does focus
  updateActions();
}

function stopAnswers() {
  inFlight().forEach((a) => send({ action: "stop", generation: a.generationId }));
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
  const editable = conversationId && !busy();
  messagesEl.querySelectorAll("article.user button.edit").forEach((b) => { b.disabled = !editable; });
  messagesEl.querySelectorAll("article.assistant button.regenerate").forEach((b) => { b.disabled = busy(); });
}

function setStatus(text, isError = false) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

function send(payload) {
  if (!socket || socket.readyState !== WebSocket.OPEN) {
    connectionLost = true;
    setStatus("Not connected; retrying…", true);
    return false;
  }
  socket.send(JSON.stringify(payload));
  return true;
}

function follow(answer) {
  send({ action: "follow", generation: answer.generationId, after: answer.lastId, steps: answer.steps.length });
}

function enterConversation(id, title) {
  conversationId = id;
  history.replaceState(null, "", `/c/${id}/`);
  listConversation(id, title);
  setTitle(title);
  $("rename").hidden = $("delete").hidden = $("export").hidden = false;
  $("export-md").href = `/c/${id}/export.md`;
  $("export-json").href = `/c/${id}/export.json`;
  $("system-state").textContent = ""; // "kept for this chat's first message" is done with
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
      answer = addAnswer(msg.message, msg.generation, sent ? sent.pair : $("pair").value);
    }
    answers.set(msg.generation, answer);
    showLeftOut(answer, msg.messages_left_out);
    updateButtons();
  } else if (msg.type === "event") {
    const answer = answers.get(msg.generation);
    if (answer && !answer.done) answer.apply(msg.id, msg.event);
  } else if (msg.type === "error") {
    if (msg.code === "not_found" && msg.param === "conversation") {
      chatGone(pendingSends.get(msg.ref)?.text);
      return;
    }
    setStatus(inPlainWords(msg), true);
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
    if (connectionLost) setStatus(""); // the other notices stay
    connectionLost = false;
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
    // 4503: the server turned the socket away for now (its database did not answer)
    connectionLost = true;
    setStatus(e.code === 4503 ? "The server is unavailable for a moment; reconnecting…" : "Connection lost; reconnecting…", true);
    setTimeout(connect, retryMs);
    retryMs = Math.min(retryMs * 2, 5000);
  });
}

function initMessages() {
  let previousPair = page.pair;
  for (const m of page.messages) {
    if (m.role === "user") {
      addUserMessage(m.text);
      continue;
    }
    const g = m.generation;
    const answer = addAnswer(m.id, g ? g.id : "", g ? g.pair : previousPair);
    showLeftOut(answer, m.messages_left_out);
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
  $("prompt").focus(); // typing goes on where it was, whatever was clicked
  if (busy()) {
    setStatus(ONE_AT_A_TIME, true);
    return;
  }
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
    starting = true;
    updateButtons();
    try { // the system prompt is kept before the first message is sent
      const made = await post("/c/new/", { system_prompt: system });
      conversationId = made.conversation;
    } catch (err) {
      setStatus(inPlainWords(err), true);
      return;
    } finally {
      starting = false;
      updateButtons();
    }
  }
  const ref = String(++refCounter);
  const pair = $("pair").value;
  const payload = { action: "send", conversation: conversationId, pair, text, settings: currentSettings(), ref };
  if (send(payload)) {
    pendingSends.set(ref, { text, pair });
    $("prompt").value = "";
    updateButtons();
  }
});

// The open chat was deleted (in another tab): the page becomes a new chat, the text sent kept in the box.
function chatGone(text) {
  pendingSends.clear();
  answers.clear();
  messagesEl.querySelectorAll("article.message").forEach((el) => el.remove());
  conversationId = null;
  history.replaceState(null, "", "/");
  setTitle("New chat");
  $("rename").hidden = $("delete").hidden = $("export").hidden = true;
  if (text) $("prompt").value = text;
  showEmptyState();
  updateButtons();
  setStatus("That chat no longer exists (deleted in another tab?): this is a new one.", true);
}

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
    if (e.key === "Escape") {
      e.preventDefault(); // the page's Escape (stop an answer) is not this one
      close();
      article.querySelector("button.edit")?.focus();
    }
  });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const problem = busy() ? ONE_AT_A_TIME : area.value.trim() ? settingsProblem() : "Type a message first.";
    if (problem) {
      setStatus(problem, true);
      return;
    }
    save.disabled = true;
    starting = true;
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
      const answer = addAnswer(started.message, started.generation, $("pair").value);
      answers.set(started.generation, answer);
      showLeftOut(answer, started.messages_left_out);
      follow(answer);
    } catch (err) {
      save.disabled = false;
      setStatus(inPlainWords(err), true);
    } finally {
      starting = false;
      updateButtons();
    }
  });
}

$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("composer").requestSubmit();
});

$("stop").addEventListener("click", stopAnswers);

$("show-steps").addEventListener("change", () => {
  $("legend").hidden = !$("show-steps").checked;
  answers.forEach((a) => a.render());
});

// ------------------------------------------------------------------ conversation management
initConversations(() => conversationId, page.system_prompt, setStatus);
// Escape stops the answer being written; the edit box, the rename box and the phone's sidebar, whose
// listeners come first (the sidebar's is added just above), take their own Escape (they mark it handled).
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && !e.defaultPrevented && inFlight().length) {
    e.preventDefault();
    stopAnswers();
  }
});

initPairs(page, pairs, setStatus);
$("legend").hidden = !$("show-steps").checked; // as kept from the last visit
initMessages();
updateButtons();
if (page.gone) {
  history.replaceState(null, "", "/");
  setStatus("That chat no longer exists (it was deleted): this is a new one.");
}
connect();
