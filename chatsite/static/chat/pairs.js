// The pair picker, the settings sent with each message (checked against the pair's own limits, kept per
// pair in this browser) and the empty state that introduces the pair. Only the page's elements are read
// here: the page data and the pairs come in from chat.js.

import { UNSERVED } from "./words.js";

const $ = (id) => document.getElementById(id);
const SETTINGS = ["max-tokens", "k", "threshold", "temperature", "speculative"]; // the inputs kept per pair
const settingsKey = (slug) => `specchat:settings:${slug}`;

export function initPairs(page, pairs, setStatus) {
  const select = $("pair");
  for (const pair of page.pairs) {
    const option = document.createElement("option");
    option.value = pair.slug;
    // A pair nobody serves cannot answer: greyed out, saying why (as of the page's load).
    option.disabled = pair.served === false;
    option.textContent = option.disabled ? `${pair.name} — nobody serves it` : pair.name;
    option.title = option.disabled ? UNSERVED : pair.description;
    select.appendChild(option);
  }
  select.value = page.pair;
  if (select.selectedOptions[0]?.disabled) { // another pair that can answer, if there is one
    select.value = [...select.options].find((o) => !o.disabled)?.value ?? page.pair;
  }
  const show = () => {
    restoreSettings(select.value);
    showPair(pairs.get(select.value));
  };
  select.addEventListener("change", show);
  for (const id of SETTINGS) {
    for (const type of ["input", "change"]) $(id).addEventListener(type, () => keepSettings(select.value));
  }
  initOptions();
  $("greedy").addEventListener("click", () => {
    $("temperature").value = "0";
    keepSettings(select.value);
  });
  $("show-steps").checked = localStorage.getItem("specchat:show-steps") === "1";
  $("show-steps").addEventListener("change", () => localStorage.setItem("specchat:show-steps", $("show-steps").checked ? "1" : "0"));
  if (!page.pairs.length) setStatus("No pair is registered yet: an admin adds one in Admin → Model pairs.", true);
  show();
}

// The Options row, opened and closed by its button; each setting's explanation shown under it when the setting is
// tapped or focused (a phone shows no tooltip).
function initOptions() {
  const toggle = $("options-toggle");
  toggle.addEventListener("click", () => {
    const open = toggle.getAttribute("aria-expanded") !== "true";
    toggle.setAttribute("aria-expanded", String(open));
    $("option-fields").hidden = !open;
  });
  for (const type of ["focusin", "click"]) {
    $("option-fields").addEventListener(type, (e) => {
      const help = e.target.closest("label")?.dataset.help;
      if (help) $("option-help").textContent = help;
    });
  }
}

function showPair(pair) {
  const maxTokens = $("max-tokens");
  if (pair) {
    maxTokens.max = pair.max_new_tokens_cap;
    if (Number(maxTokens.value) > pair.max_new_tokens_cap) maxTokens.value = pair.max_new_tokens_cap;
    // What the server does for an answer alone when K is left empty, as planned for this host (0: the main model
    // alone, faster here).
    const k = pair.planned_k;
    $("k").placeholder = k === 0 ? "auto (off)" : k ? `auto (${k})` : "auto";
  }
  // Left empty, the temperature is the publisher's for this pair (with its top-p and top-k), or 0.
  const sampling = pair?.chat_sampling ?? {};
  $("temperature").placeholder = sampling.temperature !== undefined ? `auto (${sampling.temperature})` : "auto (0)";
  $("sampling-note").textContent = describeSampling(sampling);
  $("pair-description").textContent = pair ? pair.description : "";
  $("pair-description").title = $("pair-description").textContent; // in full, where one line cuts it
  showEmptyState();
  $("empty-pair").textContent = pair ? pair.name : "No pair yet";
  $("empty-description").textContent = pair
    ? pair.description || "Ask something: answers stream in as the main model checks the draft's guesses."
    : "An admin registers a pair in Admin → Model pairs (or `python manage.py register_demo_pair`).";
  $("empty-unavailable").hidden = !(pair && pair.served === false);
  $("empty-unavailable").textContent = UNSERVED;
  $("prompt").placeholder = pair && pair.completes_text ? "def quicksort(numbers):" : "Message";
}

export function showEmptyState() {
  $("empty").hidden = $("messages").querySelector("article.message") !== null;
  $("pair-description").hidden = !$("empty").hidden; // said once: in the empty state, else under the composer
}

// Regenerate asks for another answer: one drawn at this temperature, unless Options set one (the same settings
// would give the same text word for word: a new message is answered at temperature 0, the likeliest words).
export const REGENERATE_TEMPERATURE = 0.7;

export function regenerateSettings(pair) {
  const settings = currentSettings();
  if (pair?.chat_sampling?.temperature === undefined) settings.temperature ??= REGENERATE_TEMPERATURE;
  return settings; // else the pair samples anyway, as its publisher advises
}

function describeSampling(sampling) {
  if (sampling.temperature === undefined) return "Empty: the likeliest word each time (greedy).";
  const parts = [`temperature ${sampling.temperature}`];
  if (sampling.top_p !== undefined) parts.push(`top-p ${sampling.top_p}`);
  if (sampling.top_k !== undefined) parts.push(`top-k ${sampling.top_k}`);
  if (sampling.repetition_penalty !== undefined) parts.push(`repetition penalty ${sampling.repetition_penalty}`);
  return `Empty: as the model's publisher advises (${parts.join(", ")}). 0: greedy, the likeliest word each time.`;
}

export function currentSettings() {
  const num = (id) => ($(id).value === "" ? null : Number($(id).value));
  const settings = { speculative: $("speculative").checked };
  if (num("max-tokens") !== null) settings.max_tokens = num("max-tokens"); // else: as long as the answer needs
  if (num("temperature") !== null) settings.temperature = num("temperature");
  if (num("k") !== null) settings.num_assistant_tokens = num("k");
  if (num("threshold") !== null) settings.assistant_confidence_threshold = num("threshold");
  return settings;
}

// What was set for a pair last, in this browser: the inputs' values (max tokens, K, threshold, temperature,
// speculative), kept as they are typed, whether or not a message is sent with them.
function keepSettings(slug) {
  const values = Object.fromEntries(SETTINGS.map((id) => [id, $(id).type === "checkbox" ? $(id).checked : $(id).value]));
  values.version = 2; // kept since the defaults became empty: its values are the user's own
  localStorage.setItem(settingsKey(slug), JSON.stringify(values));
}

// The old defaults, which any change of another setting kept beside it: 128 max tokens cut answers short, and
// temperature 0 kept Regenerate from giving another answer. Read as the new defaults (empty: as the server decides).
const OLD_DEFAULTS = { "max-tokens": "128", temperature: "0" };

function restoreSettings(slug) {
  let kept = {};
  try {
    kept = JSON.parse(localStorage.getItem(settingsKey(slug)) || "{}") || {};
  } catch {
    // an unreadable entry: the inputs' defaults
  }
  for (const id of SETTINGS) {
    const input = $(id);
    const old = kept.version === undefined && kept[id] === OLD_DEFAULTS[id];
    const value = (old ? undefined : kept[id]) ?? (input.type === "checkbox" ? input.defaultChecked : input.defaultValue);
    if (input.type === "checkbox") input.checked = Boolean(value);
    else input.value = String(value);
  }
}

// Checked here, with the pair's own cap, before anything is sent; the server checks again.
export function settingsProblem() {
  if ($("k").value !== "" && $("threshold").value !== "") {
    return "Options: set K or Threshold, not both (K: tokens the draft proposes each step; Threshold: it proposes while that sure).";
  }
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
