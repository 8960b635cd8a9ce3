// The chat page: one websocket, answers streamed from their Redis streams, resumed after a reconnect
// from the last event id each answer rendered (so no token is lost or shown twice). Conversation
// management (rename, delete, system prompt, edit and resend, versions) goes over small JSON POSTs.
// A conversation is a tree of versions (an answer regenerated, a message edited); the server keeps which
// path it shows, and every action that changes it answers with that path, which the page lists anew.
// This module keeps the page's state (the socket, the answers, the current conversation); the modules it
// imports hold no state of it and are handed what they need, so none of them imports this one.

import { Answer } from "./answer.js";
import { initConversations, listConversation, post, retitle, setTitle } from "./conversations.js";
import { currentSettings, initPairs, regenerateSettings, settingsProblem, showEmptyState } from "./pairs.js";
import { copyButton, copyText, decorateCode } from "./render.js";
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
function addBubble(role, messageId) {
  const el = document.createElement("article");
  el.className = `message ${role}`;
  el.dataset.message = messageId;
  el.innerHTML = `<div class="body"></div><div class="meta"></div>`;
  messagesEl.appendChild(el);
  showEmptyState();
  return el;
}

// A long message (a pasted file, say) is shown folded to its first lines, with a button to show it all: it would
// push the answers out of view.
const FOLD_LINES = 12;
const FOLD_CHARS = 1200;

function addUserMessage(messageId, text) {
  const el = addBubble("user", messageId);
  const body = el.querySelector(".body");
  body.dataset.text = text; // as typed: what Edit starts from and a completion pair continues
  showUserText(body, text);
  const lines = text.split("\n").length;
  if (lines > FOLD_LINES || text.length > FOLD_CHARS) {
    body.classList.add("folded");
    const folded = `Show all (${lines > FOLD_LINES ? `${lines} lines` : `${text.length.toLocaleString()} characters`})`;
    const toggle = copyButton(folded, "show-all", "Show or fold this message");
    toggle.setAttribute("aria-expanded", "false");
    toggle.addEventListener("click", () => {
      const open = body.classList.toggle("folded") === false;
      toggle.textContent = open ? "Show less" : folded;
      toggle.setAttribute("aria-expanded", String(open));
    });
    el.insertBefore(toggle, el.querySelector(".meta"));
  }
  return el;
}

// Code the user pasted between ``` fences is shown as code (highlighted, with Copy), the rest as typed. A completion
// pair's prompt is code as a whole, shown as typed. The user's text goes in as text nodes only, never as HTML.
const USER_FENCE = /^```([^\n`]*)\n([\s\S]*?)\n```[ \t]*$/gm;

function showUserText(body, text) {
  if (pairs.get($("pair").value)?.completes_text) {
    body.textContent = text;
    return;
  }
  body.replaceChildren();
  let at = 0;
  for (const match of text.matchAll(USER_FENCE)) {
    body.append(text.slice(at, match.index).replace(/\n$/, ""));
    const pre = document.createElement("pre");
    pre.title = match[1].trim().split(/\s+/)[0]; // the language, as decorateCode reads it from the renderer's blocks
    const code = document.createElement("code");
    code.textContent = match[2];
    pre.append(code);
    body.append(pre);
    at = match.index + match[0].length;
  }
  body.append(text.slice(at).replace(/^\n/, ""));
  decorateCode(body, new Map());
}

// ‹ 1/2 ›: which version of its turn a message is, and the way to the others (one at a time is shown).
function addVersions(el, messageId, versions) {
  if (!versions || versions.length < 2) return;
  const at = versions.indexOf(messageId);
  const nav = document.createElement("nav");
  nav.className = "versions";
  nav.setAttribute("aria-label", "Versions");
  const arrow = (text, label, target) => {
    const button = copyButton(text, "version", label);
    button.setAttribute("aria-label", label);
    button.disabled = target == null;
    if (target == null) button.dataset.end = "1"; // stays disabled whatever else happens
    button.addEventListener("click", () => showVersion(target, label));
    return button;
  };
  const count = document.createElement("span");
  count.textContent = `${at + 1}/${versions.length}`;
  count.setAttribute("aria-label", `version ${at + 1} of ${versions.length}`);
  nav.append(arrow("‹", "Previous version", versions[at - 1]), count, arrow("›", "Next version", versions[at + 1]));
  el.insertBefore(nav, el.querySelector(".meta"));
}

async function showVersion(messageId, arrowLabel) {
  if (busy()) {
    setStatus(ONE_AT_A_TIME, true);
    return;
  }
  try {
    showPath((await post(`/m/${messageId}/show/`, {})).messages);
    setStatus("");
    // The clicked arrow was listed anew: focus goes to its like on the version shown (the other at the end).
    const arrows = [...document.querySelectorAll(`article[data-message="${messageId}"] nav.versions button`)];
    (arrows.find((b) => b.getAttribute("aria-label") === arrowLabel && !b.disabled) ?? arrows.find((b) => !b.disabled))?.focus();
  } catch (err) {
    setStatus(inPlainWords(err), true);
  }
}

// The list follows a streaming answer only while its reader is at the end, as ChatGPT's does: a reader who
// scrolled up to read stays where they are, and a "Latest" button takes them back (and following again).
const jumpButton = $("jump-latest");
let following = true;
const atEnd = (height = messagesEl.clientHeight) => messagesEl.scrollHeight - messagesEl.scrollTop - height < 40;

function scrollDown() {
  following = true;
  messagesEl.scrollTop = messagesEl.scrollHeight;
  jumpButton.hidden = true;
}

function followStream() {
  if (following) scrollDown();
  else jumpButton.hidden = false;
}

messagesEl.addEventListener("scroll", () => {
  following = atEnd();
  if (following) jumpButton.hidden = true;
}, { passive: true });
jumpButton.addEventListener("click", scrollDown);

// A panel opening (options, system prompt) or a phone's keyboard shrinks the list: one that was read at
// its end stays at its end, so the last answer's Copy and Regenerate do not slip under the composer.
// (Judged with the height it had: by the time the observer runs, the browser may have scrolled it a bit.)
let shownHeight = messagesEl.clientHeight;
new ResizeObserver(() => {
  if (atEnd(shownHeight)) scrollDown();
  shownHeight = messagesEl.clientHeight;
}).observe(messagesEl);

function addAnswer(messageId, generationId, pairSlug, earlier) {
  return new Answer(addBubble("assistant", messageId), messageId, generationId, pairs.get(pairSlug), chatForAnswers,
    earlier);
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
  followStream,
  finished: updateButtons,
  actionsShown() {
    updateActions();
    followStream(); // the answer's buttons, in view of a reader at the end
  },
  regenerate: (answer) => askAgain("regenerate", answer),
  continueAnswer: (answer) => askAgain("continue", answer),
};

// Regenerate (a new version of the answer) or Continue (the same answer written further): over the socket,
// the answer's buttons given back if the server refuses.
function askAgain(action, answer) {
  if (busy()) {
    setStatus(ONE_AT_A_TIME, true);
    answer.addActions();
    return;
  }
  const ref = String(++refCounter);
  pendingRegenerate.set(ref, answer);
  const settings = action === "regenerate" ? regenerateSettings(pairs.get($("pair").value)) : currentSettings();
  if (!send({ action, message: answer.messageId, settings, ref })) {
    pendingRegenerate.delete(ref);
    answer.addActions();
  }
  updateButtons();
}

const pendingRegenerate = new Map(); // ref -> the answer being regenerated or continued
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

// Regenerate under the last answer only (the server takes any shown answer's regeneration, but one button reads
// clearer); Continue under every answer cut or stopped (an earlier one goes on as a new version of its turn); Edit
// on every message sent: editing an earlier one starts a branch.
function updateActions() {
  const articles = [...messagesEl.querySelectorAll("article.message")];
  const last = articles.at(-1);
  for (const button of messagesEl.querySelectorAll("button.regenerate")) {
    button.hidden = button.closest("article") !== last;
  }
  for (const article of articles) {
    if (!article.classList.contains("user") || article.querySelector(".actions") || article.classList.contains("editing")) continue;
    const actions = document.createElement("div");
    actions.className = "actions";
    const edit = copyButton("Edit", "edit", "Edit this message and send it again (the answers after it stay, as a version)");
    edit.addEventListener("click", () => startEdit(article));
    actions.appendChild(edit);
    article.appendChild(actions);
  }
  const editable = conversationId && !busy();
  messagesEl.querySelectorAll("article.user button.edit").forEach((b) => { b.disabled = !editable; });
  messagesEl.querySelectorAll("article.assistant :is(button.regenerate, button.continue), nav.versions button")
    .forEach((b) => { if (b.dataset.end !== "1") b.disabled = busy(); });
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
    if (conversationId !== msg.conversation || !document.querySelector(`#conversations a[data-id="${msg.conversation}"]`)) {
      enterConversation(msg.conversation, msg.title);
    }
    pendingSends.delete(msg.ref);
    pendingRegenerate.delete(msg.ref);
    showPath(msg.messages); // the new answer among them, followed by this socket from its first event
    scrollDown();
  } else if (msg.type === "title") {
    retitle(msg.conversation, msg.title, msg.conversation === conversationId);
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

// The conversation's shown path, listed anew: on opening it and after each action that changed it. (Answers
// still being written are only ever the last, new one: versions are not switched meanwhile.)
function showPath(messages) {
  answers.clear();
  messagesEl.querySelectorAll("article.message").forEach((el) => el.remove());
  let previousPair = page.pair;
  for (const m of messages) {
    if (m.role === "user") {
      addVersions(addUserMessage(m.id, m.text), m.id, m.versions);
      continue;
    }
    const g = m.generation;
    const answer = addAnswer(m.id, g ? g.id : "", g ? g.pair : previousPair, m.earlier_text);
    addVersions(answer.el, m.id, m.versions);
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
  updateButtons();
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
  const original = body.dataset.text;
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
      const started = await post(`/m/${article.dataset.message}/edit/`, { text: area.value, settings: currentSettings() });
      showPath(started.messages); // the edited message as a new version, the old one and its answers a click away
      setStatus("");
      follow(answers.get(started.generation));
      scrollDown();
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
showPath(page.messages);
if (page.gone) {
  history.replaceState(null, "", "/");
  setStatus("That chat no longer exists (it was deleted): this is a new one.");
}
connect();
