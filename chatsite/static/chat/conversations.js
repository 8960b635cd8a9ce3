// The sidebar's list of conversations, and the current conversation's title, rename, delete and system
// prompt, which go over small JSON POSTs. The current conversation's id is chat.js's alone (a new chat
// gets one once its first message is accepted): it comes in as `conversation`, asked for at each use.

const $ = (id) => document.getElementById(id);
const csrfToken = document.querySelector("input[name=csrfmiddlewaretoken]").value;

export async function post(url, body) {
  const response = await fetch(url, {
    method: "POST", headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken },
    body: JSON.stringify(body), credentials: "same-origin",
  });
  const data = await response.json().catch(() => ({ error: { message: `The server answered ${response.status}.` } }));
  if (data.error) throw Object.assign(new Error(data.error.message), { code: data.error.code, param: data.error.param });
  return data;
}

export function listConversation(id, title) {
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

// A title the pair wrote after the chat's first answer: the list's entry renamed where it stands, and the page's
// heading if it is this chat.
export function retitle(id, title, current) {
  const link = document.querySelector(`#conversations a[data-id="${id}"]`);
  if (link) link.textContent = title;
  if (current) setTitle(title);
}

export function setTitle(title) {
  $("conversation-title").textContent = title;
  document.title = `${title} · SpecChat`;
}

export function initConversations(conversation, systemPrompt, setStatus) {
  initTitleActions(conversation, setStatus);
  initActionsMenu();
  initSystemPrompt(conversation, systemPrompt, setStatus);
  initSidebar();
}

function initTitleActions(conversation, setStatus) {
  $("rename").addEventListener("click", () => {
    $("rename-input").value = $("conversation-title").textContent;
    $("rename-form").hidden = false;
    $("conversation-title").hidden = true;
    $("rename-input").select();
  });
  $("rename-cancel").addEventListener("click", closeRename);
  $("rename-input").addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      e.preventDefault(); // the page's Escape (stop an answer) is not this one
      closeRename();
    }
  });
  $("rename-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      const { title } = await post(`/c/${conversation()}/rename/`, { title: $("rename-input").value });
      setTitle(title);
      listConversation(conversation(), title);
      closeRename();
    } catch (err) {
      setStatus(err.message, true);
    }
  });

  $("delete").addEventListener("click", async () => {
    if (!confirm(`Delete “${$("conversation-title").textContent}”? This cannot be undone.`)) return;
    try {
      await post(`/c/${conversation()}/delete/`, {});
      location.href = "/";
    } catch (err) {
      setStatus(err.message, true);
    }
  });
}

// At a phone's width the chat's actions wait behind a button, so the top bar keeps to one line.
function initActionsMenu() {
  const topbar = document.querySelector(".topbar");
  const setMenu = (open) => {
    topbar.classList.toggle("menu-open", open);
    $("actions-toggle").setAttribute("aria-expanded", String(open));
  };
  $("actions-toggle").addEventListener("click", () => setMenu(!topbar.classList.contains("menu-open")));
  $("conversation-actions").addEventListener("click", (e) => {
    if (e.target.closest("button, a")) setMenu(false);
  });
  document.addEventListener("click", (e) => {
    if (!e.target.closest(".topbar")) setMenu(false);
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && topbar.classList.contains("menu-open")) {
      e.preventDefault(); // the page's Escape (stop an answer) waits for the next press
      setMenu(false);
      $("actions-toggle").focus();
    }
  });
}

function closeRename() {
  $("rename-form").hidden = true;
  $("conversation-title").hidden = false;
  $("rename").focus();
}

function initSystemPrompt(conversation, systemPrompt, setStatus) {
  $("system-prompt").value = systemPrompt;
  $("system-toggle").addEventListener("click", () => {
    const box = $("system-box");
    box.hidden = !box.hidden;
    $("system-toggle").setAttribute("aria-expanded", String(!box.hidden));
    if (!box.hidden) $("system-prompt").focus();
  });
  $("system-box").addEventListener("submit", async (e) => {
    e.preventDefault();
    if (!conversation()) { // a new chat keeps it with its first message
      $("system-state").textContent = "Kept for this chat's first message.";
      return;
    }
    try {
      const saved = await post(`/c/${conversation()}/system/`, { system_prompt: $("system-prompt").value });
      $("system-prompt").value = saved.system_prompt;
      $("system-state").textContent = "Saved: used from the next answer on.";
    } catch (err) {
      $("system-state").textContent = "";
      setStatus(err.message, true);
    }
  });
  $("system-toggle").classList.toggle("set", Boolean(systemPrompt));
}

// Titles are filtered at once; the conversations whose messages hold the words are added when the server
// answers (a moment after the typing pauses).
function initSidebar() {
  let searchTimer = null;
  const filter = (found) => {
    const words = $("search").value.toLowerCase().split(/\s+/).filter(Boolean);
    let shown = 0;
    for (const link of document.querySelectorAll("#conversations a")) {
      const match = words.every((w) => link.textContent.toLowerCase().includes(w)) || found.has(Number(link.dataset.id));
      link.parentElement.hidden = !match;
      shown += match;
    }
    $("no-match").hidden = shown > 0;
  };
  $("search").addEventListener("input", () => {
    filter(new Set());
    clearTimeout(searchTimer);
    const query = $("search").value.trim();
    if (!query) return;
    searchTimer = setTimeout(async () => {
      const response = await fetch(`/c/search/?q=${encodeURIComponent(query)}`, { credentials: "same-origin" });
      if (!response.ok || $("search").value.trim() !== query) return; // a newer search is on its way
      filter(new Set((await response.json()).conversations));
    }, 250);
  });

  $("sidebar-toggle").addEventListener("click", () => setSidebar(!$("app").classList.contains("sidebar-open")));
  $("backdrop").addEventListener("click", () => setSidebar(false));
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && $("app").classList.contains("sidebar-open")) {
      e.preventDefault(); // the page's Escape (stop an answer) waits for the next press
      setSidebar(false);
    }
  });
}

function setSidebar(open) {
  $("app").classList.toggle("sidebar-open", open);
  $("backdrop").hidden = !open;
  $("sidebar-toggle").setAttribute("aria-expanded", String(open));
}
