// The admin's Copy buttons (the new API key page): each copies the text of the element its data-copy names.
document.addEventListener("click", async (e) => {
  const button = e.target.closest("button[data-copy]");
  if (!button) return;
  const text = document.getElementById(button.dataset.copy).textContent;
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // Plain http on another host has no clipboard API: the old way, through a selection.
    const range = document.createRange();
    range.selectNodeContents(document.getElementById(button.dataset.copy));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    document.execCommand("copy");
    getSelection().removeAllRanges();
  }
  button.textContent = "Copied";
});
