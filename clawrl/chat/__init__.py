"""The OpenAI chat format, shared by every layer that reads or writes chats (a shared contract).

- `template.py`: messages (and tools) rendered into prompt token IDs with the model's chat
  template, or clawrl's generic tool prompt when the template has none;
- `tools.py`: tool calls parsed out of generated text, whole or while streaming;
- `reasoning.py`: a thinking model's answer split into reasoning and content on its token IDs;
- `text.py`: incremental detokenisation and stop strings.

Used by the API (requests and answers), the judge (its prompts), algo (the teacher's
enhanced prompt) and the guard (the canary's prompts); it imports nothing of clawrl's.
"""
