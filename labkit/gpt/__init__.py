"""The small GPT of the lab: config, model, training steps, corpus, compile entry."""
