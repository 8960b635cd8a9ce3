// The pair picker, the settings sent with each message (checked against the pair's own limits) and the
// empty state that introduces the pair. Only the page's elements are read here: the page data and the
// pairs come in from chat.js.

const $ = (id) => document.getElementById(id);

const UNSERVED = "No worker serves this pair now. Start everything with <code>make run</code> (or <code>python manage.py "
  + "serve</code>), or ask an admin to load it: Admin → Model pairs → select it → “Load on every live worker”.";

export function initPairs(page, pairs, setStatus) {
  const select = $("pair");
  for (const pair of page.pairs) {
    const option = document.createElement("option");
    option.value = pair.slug;
    option.textContent = `${pair.name} (${pair.mode})${pair.served === false ? " — not served now" : ""}`;
    if (pair.description) option.title = pair.description;
    select.appendChild(option);
  }
  select.value = page.pair;
  const show = () => showPair(pairs.get(select.value));
  select.addEventListener("change", show);
  if (!page.pairs.length) setStatus("No pair is registered yet: an admin adds one in Admin → Model pairs.", true);
  show();
}

function showPair(pair) {
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

export function showEmptyState() {
  $("empty").hidden = $("messages").querySelector("article.message") !== null;
  $("pair-description").hidden = !$("empty").hidden; // said once: in the empty state, else under the composer
}

export function currentSettings() {
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
export function settingsProblem() {
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
