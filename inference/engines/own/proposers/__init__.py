"""Who proposes a step's tokens on the own engine, behind one contract (`interface.Proposer`): the prompt lookup
(`prompt_lookup`) and the draft model (`draft_model`)."""
