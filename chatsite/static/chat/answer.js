// One assistant answer: its generation's events applied in order and rendered as they come. What it asks of
// the page around it comes in as `chat` from chat.js, so that this module imports only the rendering
// helpers and the page's state keeps one owner.

import { copyButton, decorateCode, formatMetrics, markSteps, plural, renderMarkdown } from "./render.js";

export class Answer {
  // `earlier`: the text of an answer continued after it reached the max tokens, before this generation's.
  constructor(el, messageId, generationId, pair, chat, earlier = "") {
    this.el = el;
    this.earlier = earlier;
    this.chat = chat;
    this.messageId = messageId;
    this.generationId = generationId;
    this.pair = pair;
    this.el.dataset.generation = generationId;
    this.highlights = new Map(); // code text -> its highlighted HTML, so streaming re-renders stay cheap
    this.reset();
  }

  reset() {
    this.lastId = "0-0";
    this.steps = [];
    this.text = this.earlier;
    this.finishReason = null;
    this.done = false;
    this.renderQueued = false;
    this.el.classList.add("streaming");
    this.el.querySelector(".meta").textContent = "Waiting for a free worker…";
    this.el.querySelector(".actions")?.remove();
  }

  // A completion pair continues the user's text: the answer is shown after its prompt, as one block.
  prompt() {
    const user = this.el.previousElementSibling;
    return this.pair?.completes_text && user?.classList.contains("user") ? user.querySelector(".body").dataset.text : null;
  }

  shownText() {
    const prompt = this.prompt();
    return prompt == null ? this.text : prompt + this.text;
  }

  apply(id, event) {
    this.lastId = id;
    if (event.type === "loading") {
      this.el.querySelector(".meta").textContent = "Loading the pair's models on the worker (the first answer after a start, or after a while unused)…";
    } else if (event.type === "start") {
      this.el.querySelector(".meta").textContent = `${plural(event.prompt_tokens, "prompt token")} · writing…`;
    } else if (event.type === "prompt") {
      // A long prompt (a pasted file, a long conversation) being read: how far, not a blank wait.
      const percent = Math.floor((100 * event.read) / event.total);
      this.el.querySelector(".meta").textContent = `Reading the prompt: ${percent}% of ${plural(event.total, "token")}…`;
    } else if (event.type === "delta") {
      for (const step of event.steps) {
        this.steps.push(step);
        this.text += step[0] + step[1];
      }
      this.queueRender();
    } else if (event.type === "done") {
      this.text = this.earlier + event.text;
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
    this.finishReason = metrics?.finish_reason ?? null;
    this.el.classList.remove("streaming");
    this.render();
    const meta = this.el.querySelector(".meta");
    meta.replaceChildren();
    if (metrics) {
      const { summary, details } = formatMetrics(metrics, this.pair);
      // A continued answer's figures are its last part's (each part is a generation of its own).
      meta.append((this.earlier ? "Continued; this part: " : "") + summary);
      const more = document.createElement("details");
      more.className = "more";
      const title = document.createElement("summary");
      title.textContent = "Details";
      const text = document.createElement("p");
      text.textContent = details;
      more.append(title, text);
      meta.append(more);
    }
    this.addActions();
    this.chat.finished();
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
    if (prompt != null) {
      body.innerHTML = "<pre><code></code></pre>";
      body.querySelector("code").textContent = prompt + this.text;
    } else {
      body.innerHTML = renderMarkdown(this.text);
    }
    decorateCode(body, this.highlights);
    const showSteps = this.chat.showSteps() && this.steps.length > 0;
    body.className = showSteps ? "body steps" : "body";
    if (showSteps) markSteps(body, this.shownText(), this.steps, (prompt?.length ?? 0) + this.earlier.length);
    this.chat.followStream();
  }

  addActions() {
    if (this.el.querySelector(".actions")) return;
    const actions = document.createElement("div");
    actions.className = "actions";
    const regen = copyButton("Regenerate", "regenerate", "Write this answer again");
    regen.addEventListener("click", () => {
      actions.remove();
      this.chat.regenerate(this);
    });
    actions.append(copyButton("Copy", "copy-answer", "Copy the whole answer"), regen);
    // Cut at the max tokens, stopped, or stopped as it repeated itself: written further on demand, as one answer.
    const why = { length: "it reached the max tokens", stopped: "it was stopped",
                  repeating: "it was stopped as it repeated itself" }[this.finishReason];
    if (why && this.text) {
      const more = copyButton("Continue", "continue", `Write this answer further (${why})`);
      more.addEventListener("click", () => {
        actions.remove();
        this.chat.continueAnswer(this);
      });
      actions.append(more);
    }
    this.el.appendChild(actions);
    this.chat.actionsShown();
  }
}
