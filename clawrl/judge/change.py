"""Change requests: a next message that asks to change the answer just given, read as a complaint.

A user who wants another answer rarely says the first one failed. They ask, politely, for the
change: "Could you put the number in bold?", "Can you write it in German instead?", "Next time,
put the answer first." The likelihood judge read such requests like any other polite follow-up,
most often +1 (issue 53: 9 of 14 tried), so the policy was rewarded for the very answer the user
asked to change. This module reads the request's *form*, not a list of the things users prefer
(those are open-ended: a language, a tone, a sign-off, units, how much working to show):

    change request  =  a request            "could you", "can you", "would you (mind)", "please",
                                            "I'd rather / prefer", "next time", "from now on",
                                            or an imperative change verb opening a sentence
                                            ("Make it ...", "Put ...", "Use ...")
                       aimed at the answer  a word that points back at it ("it", "that", "this",
                                            "the answer", "the steps", "each ...", "your ..."),
                                            one that asks for a difference ("instead", "rather",
                                            "again", "more", "less", "warmer"), or a form the
                                            answer could take ("in bold", "as a table", "in
                                            kilometres", "in German", "on its own line")
                       not a new task       no "also", "another", "the same for", "what about",
                                            "next question" (a new request builds on the answer:
                                            the likelihood reads it, usually +1)

"Next time" and "from now on" point back by themselves: they only make sense of an answer the
user wants otherwise. The reading is sentence by sentence, so "Thanks, but could you number
the steps?" is a change request and "Thanks! Could you do the same for 9 pens?" is not.

Where one is found the vote leans to "bad" exactly as a dissatisfaction cue does (the calibrated
odds of bad times `cues.CUE_ODDS`), and the message itself is the hint (`likelihood.next_state_hint`).
English only, like the cues. Measured on clawrl/judge/requests.jsonl (written before this module,
never tuned on) with `bench/judge.py --cases clawrl/judge/requests.jsonl`: docs/recording-and-judging.md.
"""

from __future__ import annotations

import re

# A request: a modal addressed to the assistant, a polite marker, a stated preference, or a rule for
# later answers. Matched anywhere in a sentence.
_ASK = re.compile(
    r"\b(?:could|can|would|will|might) you\b|\bwould you mind\b|\bplease\b|\bpls\b"
    r"|\bi(?:'d| would) (?:rather|prefer|like(?: it)?)\b|\bi (?:prefer|want|need) (?:it|that|this|them)\b"
    r"|\bnext time\b|\bfrom now on\b|\bin (?:the )?future\b|\bgoing forward\b|\bhow about (?:you|making)\b",
    re.IGNORECASE,
)
# An imperative that changes an answer, opening a sentence ("Make it friendlier", "Put the answer first").
_IMPERATIVE = re.compile(
    r"^\W*(?:make|put|use|write|rewrite|give|show|turn|add|drop|remove|skip|lose|switch|answer|end|start"
    r"|finish|sign|group|number|round|format|keep|split|list|bold|translate|convert|change|swap|move"
    r"|include|leave out|spell|explain|say)\b",
    re.IGNORECASE,
)
# Points back at the answer just given, or at a part or property of it.
_BACK = re.compile(
    r"\b(?:it|that|this|them|those|these|the two)\b(?! (?:is|was|'s) (?:a|an|the) new\b)"
    r"|\b(?:the|your|each|every) (?:\w+ )?(?:answer|result|number|reply|response|steps?|working|maths?"
    r"|calculation|formula|list|items?|lines?|sentences?|paragraphs?|words|text|email|message|note"
    r"|letter|code|example|explanation|summary|ingredients|tone|format|units?|order|end|start|ending)\b"
    r"|\b(?:instead|rather|again|as well|otherwise)\b|\bnext time\b|\bfrom now on\b",
    re.IGNORECASE,
)
# Asks for a difference in amount or kind: "more detail", "less maths", "a bit warmer", "shorter".
# A comparative's suffix alone ("-er") is not read: too many nouns end so ("burger", "paper").
_DIFFERENCE = re.compile(
    r"\b(?:more|less|fewer)\b(?! about\b)|\b(?:a bit|a little|slightly|much) \w+er\b"
    r"|\b(?:shorter|longer|simpler|clearer|friendlier|warmer|plainer|briefer|bigger|smaller)\b",
    re.IGNORECASE,
)
# Names a form the answer could take: "in bold", "as a table", "in kilometres", "in German", "on its
# own line". A request for one of these changes how an answer is written, not what is asked.
_LANGUAGES = (
    "english|french|german|spanish|portuguese|italian|dutch|chinese|japanese|korean|russian|arabic|hindi"
    "|polish|swedish|norwegian|danish|finnish|greek|turkish|hebrew|ukrainian|czech|vietnamese|thai|welsh"
)
_FORM = re.compile(
    r"\b(?:in|as|into|with|without|using|on|to) (?:a |an |one |two |three |plain |simple |short |its own "
    r"|their own |separate |full |numbered |bullet )?(?:bold|italics?|capitals|caps|lower ?case|upper ?case"
    r"|lists?|tables?|bullets?|bullet points|steps|lines?|sentences?|paragraphs?|words|code|markdown|json"
    r"|text|prose|headings?|columns?|emoji|kilometres|kilometers|km|miles|metres|meters|feet|metric"
    r"|imperial|units|celsius|fahrenheit|decimals?|percent|percentages|figures|digits|order|"
    + _LANGUAGES
    + r")\b",
    re.IGNORECASE,
)
# Where the answer begins or ends: "end with a summary line", "open it with a greeting", "sign off
# with your name". Added after clawrl/judge/quoted.jsonl was first measured (its case 01 had been
# caught only by a word inside its quotation, which the reading no longer looks at).
_BOUNDS = re.compile(
    r"\b(?:end|start|begin|open|close|finish|sign(?: off)?)(?: (?:it|each \w+|every \w+|the \w+))? with\b",
    re.IGNORECASE,
)
# A new task that builds on the answer: not a request to change it.
_NEW_TASK = re.compile(
    r"\b(?:also|another|the same for|the same thing for|what about|how about(?! (?:you|making))"
    r"|next question|one more question|new question|different question)\b",
    re.IGNORECASE,
)
_SENTENCES = re.compile(r"(?<=[.!?;:])\s+|\s+(?:but|though|although|however),?\s+", re.IGNORECASE)


def change_request(words: str) -> str | None:
    """The first sentence of `words` that asks to change the answer just given, as `change: text`, or None."""
    for sentence in _SENTENCES.split(words):
        if _asks_for_change(sentence):
            return f"change: {sentence.strip()[:80]}"
    return None


def _asks_for_change(sentence: str) -> bool:
    if not (_ASK.search(sentence) or _IMPERATIVE.search(sentence)):
        return False
    if _NEW_TASK.search(sentence):
        return False
    aimed = (_BACK, _DIFFERENCE, _FORM, _BOUNDS)
    return any(pattern.search(sentence) for pattern in aimed)
