"""The demo pair: its main grown from the committed one without torch (`main_model`), and the
offline builder of the whole pair with the `train` extra (`build`, `data`, `training`). Nothing here
serves requests."""

SLUG = "demo-code"  # the demo pair's, as register_demo_pair registers it
