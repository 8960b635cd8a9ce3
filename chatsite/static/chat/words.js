// Errors as the chat shows them. The server's messages are worded for the API's developers (its field
// names, a worker's command line); a chat user set those things through this page's controls, so the
// errors they can cause are told here in the page's own words, chosen by the error's code and field.

const CONTROLS = {
  num_assistant_tokens: "Options → K: a whole number from 1 to 32, for a pair with a draft model; leave it empty to let the server choose.",
  assistant_confidence_threshold: "Options → Threshold: between 0 and 1, instead of K (not with it), for a pair with a draft model.",
  temperature: "Options → Temperature: from 0 (always the likeliest word) to 2.",
  max_tokens: "Max tokens: at least 1, and at most this pair's limit.",
};

export const UNSERVED = "Nobody serves this pair right now, so it cannot answer: ask an admin to start a worker for it, or pick another pair.";

export function inPlainWords({ code, param, message }) {
  if (code === "model_unavailable") return UNSERVED;
  if (code === "model_not_found") return "This pair is no longer offered: pick another one.";
  if (code === "empty_prompt") return "Type a message first.";
  if (code === "internal_error") return "Something went wrong on the server (it has been logged): try again.";
  if (code === "not_found" && param === "message") return "This message no longer exists (deleted in another tab?): reload the page.";
  if (param in CONTROLS && (code === "invalid_value" || code === "invalid_type")) return CONTROLS[param];
  return message; // the rest are worded for people already (limits, an answer being written, the database)
}
