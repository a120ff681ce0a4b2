"""The SQL of the store's migrations, one constant per migration (`clawrl.store.migrations` applies them).

Append only: never edit a constant that has shipped, a database in the field has already run it.
JSON text is stored for every list or dict (messages, token IDs, logprobs, ...); timestamps are
unix seconds as REAL.
"""

M001_INITIAL = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    ended_at REAL NULL,
    end_reason TEXT NULL,
    source TEXT NOT NULL  -- header | body | inferred
);

CREATE TABLE turns (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    idx INTEGER NOT NULL,
    turn_type TEXT NOT NULL,
    messages TEXT NOT NULL,
    tools TEXT NULL,
    prompt_ids TEXT NOT NULL,
    response_ids TEXT NOT NULL,
    logprobs TEXT NOT NULL,
    response_text TEXT NOT NULL,
    tool_calls TEXT NOT NULL,
    finish_reason TEXT NOT NULL,
    versions TEXT NOT NULL,
    temperature REAL NOT NULL,
    created_at REAL NOT NULL,
    first_token_at REAL NULL,
    finished_at REAL NOT NULL,
    next_state TEXT NULL,
    next_state_at REAL NULL
);
CREATE INDEX turns_session_idx ON turns(session_id, idx);
CREATE INDEX turns_created_at ON turns(created_at);

CREATE TABLE feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_id TEXT NOT NULL REFERENCES turns(id),
    rating INTEGER NOT NULL,
    comment TEXT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX feedback_turn ON feedback(turn_id);

CREATE TABLE judgments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_id TEXT NOT NULL REFERENCES turns(id),
    created_at REAL NOT NULL,
    score INTEGER NULL,
    hint TEXT NULL,
    votes TEXT NOT NULL,
    judge TEXT NOT NULL
);
CREATE INDEX judgments_turn ON judgments(turn_id);

CREATE TABLE samples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_id TEXT NOT NULL REFERENCES turns(id),
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    version TEXT NOT NULL,
    payload TEXT NOT NULL
);
CREATE INDEX samples_turn ON samples(turn_id);

CREATE TABLE versions (
    name TEXT PRIMARY KEY,
    step INTEGER NOT NULL,
    created_at REAL NOT NULL,
    path TEXT NULL,
    metrics TEXT NULL
);
-- v0 is the base model; julianday arithmetic gives unix seconds with a fraction.
INSERT INTO versions (name, step, created_at, path, metrics)
VALUES ('v0', 0, (julianday('now') - 2440587.5) * 86400.0, NULL, NULL);
"""

# A sample names the judgment it was made from (a newer judgment supersedes it) and
# carries its turn's session, so a session's samples are counted without a join.
M002_SAMPLE_JUDGMENT_SESSION = """
ALTER TABLE samples ADD COLUMN judgment_id INTEGER NULL REFERENCES judgments(id);
ALTER TABLE samples ADD COLUMN session_id TEXT NULL;
UPDATE samples SET session_id = (SELECT t.session_id FROM turns t WHERE t.id = samples.turn_id);
CREATE INDEX samples_status ON samples(status, id);
CREATE INDEX samples_session_kind ON samples(session_id, kind);
"""

# Append only. Never edit a shipped entry.
M003_VERSION_PARENT = """
ALTER TABLE versions ADD COLUMN parent TEXT NULL;
"""

# Why the trainer left a sample out (skipped: its defect; stale: how far behind it was).
M004_SAMPLE_STATUS_REASON = """
ALTER TABLE samples ADD COLUMN status_reason TEXT NULL;
"""

# Running totals for the dashboard and /metrics, kept by triggers in the writer's own
# transactions, so a refresh reads a few small rows instead of counting big tables.
# `counters`: turns by type, turns with a next state, sessions, samples by status.
# `reward_by_version` / `reward_by_minute`: judged turns by the version that served them
# (versions[0]) and by the minute they were served; only a turn's latest judgment counts
# (a newer one takes the older one's contribution back out).
M005_DASHBOARD_COUNTERS = """
CREATE TABLE counters (name TEXT PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0);
INSERT INTO counters (name) VALUES ('sessions'), ('turns:main'), ('turns:side'), ('turns:next_state'),
    ('samples:ready'), ('samples:trained'), ('samples:stale'), ('samples:skipped'), ('samples:superseded');
INSERT OR REPLACE INTO counters (name, n) SELECT 'sessions', count(*) FROM sessions;
INSERT OR REPLACE INTO counters (name, n)
    SELECT 'turns:' || turn_type, count(*) FROM turns GROUP BY turn_type;
INSERT OR REPLACE INTO counters (name, n)
    SELECT 'turns:next_state', count(*) FROM turns WHERE next_state IS NOT NULL;
INSERT OR REPLACE INTO counters (name, n) SELECT 'samples:' || status, count(*) FROM samples GROUP BY status;

CREATE TRIGGER counters_session AFTER INSERT ON sessions BEGIN
    UPDATE counters SET n = n + 1 WHERE name = 'sessions';
END;
CREATE TRIGGER counters_turn AFTER INSERT ON turns BEGIN
    INSERT OR IGNORE INTO counters (name) VALUES ('turns:' || NEW.turn_type);
    UPDATE counters SET n = n + 1 WHERE name = 'turns:' || NEW.turn_type;
    UPDATE counters SET n = n + 1 WHERE name = 'turns:next_state' AND NEW.next_state IS NOT NULL;
END;
CREATE TRIGGER counters_next_state AFTER UPDATE OF next_state ON turns
WHEN OLD.next_state IS NULL AND NEW.next_state IS NOT NULL BEGIN
    UPDATE counters SET n = n + 1 WHERE name = 'turns:next_state';
END;
CREATE TRIGGER counters_sample AFTER INSERT ON samples BEGIN
    INSERT OR IGNORE INTO counters (name) VALUES ('samples:' || NEW.status);
    UPDATE counters SET n = n + 1 WHERE name = 'samples:' || NEW.status;
END;
CREATE TRIGGER counters_sample_status AFTER UPDATE OF status ON samples
WHEN OLD.status != NEW.status BEGIN
    INSERT OR IGNORE INTO counters (name) VALUES ('samples:' || NEW.status);
    UPDATE counters SET n = n - 1 WHERE name = 'samples:' || OLD.status;
    UPDATE counters SET n = n + 1 WHERE name = 'samples:' || NEW.status;
END;

CREATE TABLE reward_by_version (
    version TEXT PRIMARY KEY,
    judged INTEGER NOT NULL DEFAULT 0,    -- turns with a judgment
    scored INTEGER NOT NULL DEFAULT 0,    -- ... whose judgment has a score
    score_sum INTEGER NOT NULL DEFAULT 0,
    positive INTEGER NOT NULL DEFAULT 0,
    negative INTEGER NOT NULL DEFAULT 0,
    hinted INTEGER NOT NULL DEFAULT 0     -- ... whose judgment accepted a hint
);
CREATE TABLE reward_by_minute (
    minute INTEGER PRIMARY KEY,           -- unix minute the turn was served
    judged INTEGER NOT NULL DEFAULT 0,
    scored INTEGER NOT NULL DEFAULT 0,
    score_sum INTEGER NOT NULL DEFAULT 0,
    positive INTEGER NOT NULL DEFAULT 0,
    negative INTEGER NOT NULL DEFAULT 0,
    hinted INTEGER NOT NULL DEFAULT 0
);
INSERT INTO reward_by_version (version, judged, scored, score_sum, positive, negative, hinted)
SELECT coalesce(json_extract(t.versions, '$[0]'), 'v0') AS v, count(*), sum(j.score IS NOT NULL),
    sum(coalesce(j.score, 0)), sum(coalesce(j.score, 0) > 0), sum(coalesce(j.score, 0) < 0),
    sum(j.hint IS NOT NULL)
FROM judgments j JOIN turns t ON t.id = j.turn_id
WHERE j.id = (SELECT max(id) FROM judgments WHERE turn_id = j.turn_id)
GROUP BY v;
INSERT INTO reward_by_minute (minute, judged, scored, score_sum, positive, negative, hinted)
SELECT CAST(t.created_at / 60 AS INTEGER) AS m, count(*), sum(j.score IS NOT NULL),
    sum(coalesce(j.score, 0)), sum(coalesce(j.score, 0) > 0), sum(coalesce(j.score, 0) < 0),
    sum(j.hint IS NOT NULL)
FROM judgments j JOIN turns t ON t.id = j.turn_id
WHERE j.id = (SELECT max(id) FROM judgments WHERE turn_id = j.turn_id)
GROUP BY m;

-- The new judgment adds (sign 1) and the turn's previous one, if any, is taken out (sign -1).
CREATE TRIGGER reward_judgment AFTER INSERT ON judgments BEGIN
    INSERT INTO reward_by_version (version, judged, scored, score_sum, positive, negative, hinted)
    SELECT coalesce(json_extract(t.versions, '$[0]'), 'v0'), d.sign, d.sign * (j.score IS NOT NULL),
        d.sign * coalesce(j.score, 0), d.sign * (coalesce(j.score, 0) > 0),
        d.sign * (coalesce(j.score, 0) < 0), d.sign * (j.hint IS NOT NULL)
    FROM (SELECT NEW.id AS id, 1 AS sign
          UNION ALL SELECT max(id), -1 FROM judgments WHERE turn_id = NEW.turn_id AND id < NEW.id) AS d
    JOIN judgments j ON j.id = d.id JOIN turns t ON t.id = j.turn_id
    WHERE true
    ON CONFLICT (version) DO UPDATE SET judged = judged + excluded.judged, scored = scored + excluded.scored,
        score_sum = score_sum + excluded.score_sum, positive = positive + excluded.positive,
        negative = negative + excluded.negative, hinted = hinted + excluded.hinted;
    INSERT INTO reward_by_minute (minute, judged, scored, score_sum, positive, negative, hinted)
    SELECT CAST(t.created_at / 60 AS INTEGER), d.sign, d.sign * (j.score IS NOT NULL),
        d.sign * coalesce(j.score, 0), d.sign * (coalesce(j.score, 0) > 0),
        d.sign * (coalesce(j.score, 0) < 0), d.sign * (j.hint IS NOT NULL)
    FROM (SELECT NEW.id AS id, 1 AS sign
          UNION ALL SELECT max(id), -1 FROM judgments WHERE turn_id = NEW.turn_id AND id < NEW.id) AS d
    JOIN judgments j ON j.id = d.id JOIN turns t ON t.id = j.turn_id
    WHERE true
    ON CONFLICT (minute) DO UPDATE SET judged = judged + excluded.judged, scored = scored + excluded.scored,
        score_sum = score_sum + excluded.score_sum, positive = positive + excluded.positive,
        negative = negative + excluded.negative, hinted = hinted + excluded.hinted;
END;

-- The dashboard lists the sessions most recently active.
CREATE INDEX sessions_updated_at ON sessions(updated_at);
"""

# The canary gate's verdict on a version (passed | held | unchecked) and its figures (JSON).
# A held version is never served; versions published before the gate stay unchecked.
M006_VERSION_CANARY = """
ALTER TABLE versions ADD COLUMN status TEXT NOT NULL DEFAULT 'unchecked';
ALTER TABLE versions ADD COLUMN canary TEXT NULL;
"""

# Which rotary table served the turn (clawrl/model/rope.py): 1 scaled, 0 the model's own,
# NULL unknown (turns from before, or an engine that does not say).
M007_TURN_ROPE = """
ALTER TABLE turns ADD COLUMN rope_scaled INTEGER NULL;
"""
# The grammar a forced tool call or a response_format constrained the answer with
# (clawrl/chat/grammar.py), as JSON; NULL for an unconstrained answer. The trainer
# scores such an answer under the same mask its logprobs were sampled under.
M008_TURN_GRAMMAR = """
ALTER TABLE turns ADD COLUMN grammar TEXT NULL;
"""

# Track 2 (clawrl/envs): an episode is one session run against an environment; its
# reward is posted when it ends (POST /v1/episodes). A group is G episodes of one task;
# when every one of them is in, the grpo method turns the group into samples, or drops
# it (equal rewards) and says why. Counters for /metrics and the dashboard.
M009_EPISODES = """
CREATE TABLE groups (
    id TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    task TEXT NULL,
    env TEXT NULL,
    status TEXT NOT NULL,           -- open | used | dropped | eval (episodes not for training)
    reason TEXT NULL,               -- why it was dropped
    reward_mean REAL NULL,
    reward_std REAL NULL,
    samples INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    closed_at REAL NULL
);
CREATE TABLE episodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL UNIQUE REFERENCES sessions(id),
    group_id TEXT NOT NULL REFERENCES groups(id),
    task TEXT NULL,
    env TEXT NULL,
    reward REAL NULL,               -- NULL: dropped (reason says why)
    status TEXT NOT NULL,           -- ok | dropped
    reason TEXT NULL,               -- how it ended (done, answered, turn_limit, ...) or why it was dropped
    turns INTEGER NOT NULL DEFAULT 0,
    tool_calls INTEGER NOT NULL DEFAULT 0,
    info TEXT NULL,                 -- JSON: whatever else the runner reports
    train INTEGER NOT NULL DEFAULT 1, -- 0: an evaluation episode, never trained on
    created_at REAL NOT NULL
);
CREATE INDEX episodes_group ON episodes(group_id);
CREATE INDEX groups_status ON groups(status, created_at);
INSERT INTO counters (name)
    VALUES ('episodes'), ('episodes:dropped'), ('groups:used'), ('groups:dropped'), ('groups:eval');
CREATE TRIGGER counters_episode AFTER INSERT ON episodes BEGIN
    UPDATE counters SET n = n + 1 WHERE name = 'episodes';
    UPDATE counters SET n = n + 1 WHERE name = 'episodes:dropped' AND NEW.status = 'dropped';
END;
CREATE TRIGGER counters_group AFTER UPDATE OF status ON groups
WHEN OLD.status = 'open' AND NEW.status != 'open' BEGIN
    UPDATE counters SET n = n + 1 WHERE name = 'groups:' || NEW.status;
END;
"""

# What the sampler did beyond the temperature, and what the turn's logprobs are of (JSON,
# `Turn.sampling`); NULL for turns from before (tempered). Skipped samples counted by the
# category their reason starts with ("too long: ..." -> 'skipped:too long', clawrl/train/
# trainer.py SKIP_REASONS), for /healthz, /metrics and the dashboard; the samples skipped
# before this migration are counted by what their reason said then.
M010_TURN_SAMPLING = """
ALTER TABLE turns ADD COLUMN sampling TEXT NULL;
"""
M011_SKIP_REASONS = """
CREATE TRIGGER counters_skip_reason AFTER UPDATE OF status ON samples
WHEN NEW.status = 'skipped' AND OLD.status != 'skipped' BEGIN
    INSERT OR IGNORE INTO counters (name) VALUES ('skipped:' || CASE
        WHEN instr(coalesce(NEW.status_reason, ''), ':') > 0
        THEN substr(NEW.status_reason, 1, instr(NEW.status_reason, ':') - 1) ELSE 'other' END);
    UPDATE counters SET n = n + 1 WHERE name = 'skipped:' || CASE
        WHEN instr(coalesce(NEW.status_reason, ''), ':') > 0
        THEN substr(NEW.status_reason, 1, instr(NEW.status_reason, ':') - 1) ELSE 'other' END;
END;
INSERT OR REPLACE INTO counters (name, n)
SELECT 'skipped:' || CASE
        WHEN status_reason LIKE '%max_seq_len%' THEN 'too long'
        WHEN status_reason LIKE 'empty response%' THEN 'empty response'
        WHEN status_reason LIKE '%logprobs%' THEN 'bad logprobs'
        WHEN status_reason LIKE '%teacher prompt%' THEN 'no teacher prompt'
        WHEN status_reason LIKE '%vocabulary%' THEN 'unknown tokens'
        ELSE 'other' END AS category, count(*)
FROM samples WHERE status = 'skipped' GROUP BY category;
"""

# The memory block a turn's prompt carried (clawrl/memory, `Turn.memory`), as JSON: the experience
# ids and the block, or why a picked block was dropped; NULL: no memory was used.
M012_TURN_MEMORY = """
ALTER TABLE turns ADD COLUMN memory TEXT NULL;
"""

# Memory (clawrl/memory, docs/memory.md): experiences, one short sentence each about what a user
# wants, with their provenance (turn and session ids, JSON lists), per owner; a full-text index
# (FTS5, kept by triggers) finds the ones a new lesson may merge into. Counters: turns whose
# prompt carried a memory block, and blocks dropped to keep the prompt in the window.
M013_EXPERIENCES = """
CREATE TABLE experiences (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL,
    text TEXT NOT NULL,
    state TEXT NOT NULL,            -- active | distilled | retired
    turn_ids TEXT NOT NULL,         -- JSON list: the turns that taught it
    session_ids TEXT NOT NULL,      -- JSON list: their sessions
    seen INTEGER NOT NULL DEFAULT 1,
    created_at REAL NOT NULL,
    last_seen REAL NOT NULL,
    retired_at REAL NULL
);
CREATE INDEX experiences_owner ON experiences(owner, state, last_seen);
CREATE VIRTUAL TABLE experiences_fts USING fts5(text, content='experiences', content_rowid='id');
CREATE TRIGGER experiences_fts_insert AFTER INSERT ON experiences BEGIN
    INSERT INTO experiences_fts (rowid, text) VALUES (NEW.id, NEW.text);
END;
CREATE TRIGGER experiences_fts_update AFTER UPDATE OF text ON experiences BEGIN
    INSERT INTO experiences_fts (experiences_fts, rowid, text) VALUES ('delete', OLD.id, OLD.text);
    INSERT INTO experiences_fts (rowid, text) VALUES (NEW.id, NEW.text);
END;
INSERT INTO counters (name) VALUES ('memory:injected'), ('memory:dropped');
CREATE TRIGGER counters_memory AFTER INSERT ON turns WHEN NEW.memory IS NOT NULL BEGIN
    UPDATE counters SET n = n + 1
    WHERE name = CASE WHEN json_extract(NEW.memory, '$.dropped') IS NULL THEN 'memory:injected'
        ELSE 'memory:dropped' END;
END;
"""

# Memory distillation and retirement (docs/memory.md): the retirement probe's last measure of an
# experience (`gap`: mean logprob gap of the policy's answers with and without it, nats a token;
# `probed_at`), and counters of the distillation samples made and of the probe's state changes.
M014_MEMORY_DISTILL = """
ALTER TABLE experiences ADD COLUMN gap REAL NULL;
ALTER TABLE experiences ADD COLUMN probed_at REAL NULL;
INSERT INTO counters (name) VALUES ('memory:samples'), ('memory:distilled'), ('memory:reactivated');
CREATE TRIGGER counters_memory_sample AFTER INSERT ON samples
WHEN CASE WHEN json_valid(NEW.payload) THEN json_extract(NEW.payload, '$.experience_ids') END
    IS NOT NULL BEGIN
    UPDATE counters SET n = n + 1 WHERE name = 'memory:samples';
END;
CREATE TRIGGER counters_memory_state AFTER UPDATE OF state ON experiences
WHEN OLD.state != NEW.state AND NEW.state IN ('distilled', 'active') BEGIN
    UPDATE counters SET n = n + 1
    WHERE name = CASE NEW.state WHEN 'distilled' THEN 'memory:distilled' ELSE 'memory:reactivated' END;
END;
"""

# Users (docs/users.md): whose each session is, the name its API key has in `server.users`;
# `default` for the sessions of a server without users, of the admin key, and from before. A
# turn's and a judgment's user is their session's; a sample copies it (as it copies its session),
# so the trainer picks one user's samples without a join. Versions get theirs with the adapter per user.
M015_USERS = """
ALTER TABLE sessions ADD COLUMN user TEXT NOT NULL DEFAULT 'default';
ALTER TABLE samples ADD COLUMN user TEXT NOT NULL DEFAULT 'default';
CREATE INDEX sessions_user ON sessions(user, updated_at);
CREATE INDEX samples_user_status ON samples(user, status, id);
"""

# How each next state was matched to its answer (`clawrl.types.NextStateMatch`): `history`,
# `rewritten` (the client resent another text in the answer's place) or `named`; NULL for the next
# states recorded before (all `history` or `named`) and for the turns without one.
M016_NEXT_STATE_MATCH = """
ALTER TABLE turns ADD COLUMN next_state_match TEXT NULL;
"""

# An adapter per user (docs/users.md, `train.adapters = "per_user"`): whose line of versions each
# version is on. `default` for every version from before and for the default user's (`vN`); a user's
# own versions are `<user>/vN`, numbered on their own, each user's base being v0.
M017_VERSION_USER = """
ALTER TABLE versions ADD COLUMN user TEXT NOT NULL DEFAULT 'default';
CREATE INDEX versions_user ON versions(user);
"""

# Erasing a removed user (`clawrl users erase`, clawrl/store/erase.py) deletes rows: these triggers take
# each deleted row's part back out of the running totals exactly as m005's, m009's, m011's, m013's and
# m014's put it in, so the totals stay what a recount gives (the deletes cost what was erased, never a
# scan of every table under the write lock). A turn's latest judgment deleted: its part comes out and
# the turn's judgment before it, if one is left, counts instead (an older one deleted changes nothing;
# so any order of deletes ends right); a version's or a minute's row left with no judged turn goes, as
# a recount would not make it. `memory:distilled` and `memory:reactivated` count the probe's state
# changes, events no row keeps: a deleted experience leaves them. An experience deleted leaves the
# full-text index too.
M018_DELETE_TRIGGERS = """
CREATE TRIGGER counters_session_delete AFTER DELETE ON sessions BEGIN
    UPDATE counters SET n = n - 1 WHERE name = 'sessions';
END;
CREATE TRIGGER counters_turn_delete AFTER DELETE ON turns BEGIN
    UPDATE counters SET n = n - 1 WHERE name = 'turns:' || OLD.turn_type;
    UPDATE counters SET n = n - 1 WHERE name = 'turns:next_state' AND OLD.next_state IS NOT NULL;
    UPDATE counters SET n = n - 1 WHERE OLD.memory IS NOT NULL
        AND name = CASE WHEN json_extract(OLD.memory, '$.dropped') IS NULL THEN 'memory:injected'
            ELSE 'memory:dropped' END;
END;
CREATE TRIGGER counters_sample_delete AFTER DELETE ON samples BEGIN
    UPDATE counters SET n = n - 1 WHERE name = 'samples:' || OLD.status;
    UPDATE counters SET n = n - 1 WHERE OLD.status = 'skipped' AND name = 'skipped:' || CASE
        WHEN instr(coalesce(OLD.status_reason, ''), ':') > 0
        THEN substr(OLD.status_reason, 1, instr(OLD.status_reason, ':') - 1) ELSE 'other' END;
    UPDATE counters SET n = n - 1 WHERE name = 'memory:samples'
        AND CASE WHEN json_valid(OLD.payload) THEN json_extract(OLD.payload, '$.experience_ids') END
            IS NOT NULL;
END;
CREATE TRIGGER counters_episode_delete AFTER DELETE ON episodes BEGIN
    UPDATE counters SET n = n - 1 WHERE name = 'episodes';
    UPDATE counters SET n = n - 1 WHERE name = 'episodes:dropped' AND OLD.status = 'dropped';
END;
CREATE TRIGGER counters_group_delete AFTER DELETE ON groups WHEN OLD.status != 'open' BEGIN
    UPDATE counters SET n = n - 1 WHERE name = 'groups:' || OLD.status;
END;

CREATE TRIGGER reward_judgment_delete AFTER DELETE ON judgments
WHEN NOT EXISTS (SELECT 1 FROM judgments WHERE turn_id = OLD.turn_id AND id > OLD.id) BEGIN
    INSERT INTO reward_by_version (version, judged, scored, score_sum, positive, negative, hinted)
    SELECT coalesce(json_extract(t.versions, '$[0]'), 'v0'), d.sign, d.sign * (d.score IS NOT NULL),
        d.sign * coalesce(d.score, 0), d.sign * (coalesce(d.score, 0) > 0),
        d.sign * (coalesce(d.score, 0) < 0), d.sign * (d.hint IS NOT NULL)
    FROM (SELECT -1 AS sign, OLD.score AS score, OLD.hint AS hint
          UNION ALL SELECT 1, score, hint FROM judgments
          WHERE id = (SELECT max(id) FROM judgments WHERE turn_id = OLD.turn_id)) AS d
    JOIN turns t ON t.id = OLD.turn_id
    WHERE true
    ON CONFLICT (version) DO UPDATE SET judged = judged + excluded.judged, scored = scored + excluded.scored,
        score_sum = score_sum + excluded.score_sum, positive = positive + excluded.positive,
        negative = negative + excluded.negative, hinted = hinted + excluded.hinted;
    INSERT INTO reward_by_minute (minute, judged, scored, score_sum, positive, negative, hinted)
    SELECT CAST(t.created_at / 60 AS INTEGER), d.sign, d.sign * (d.score IS NOT NULL),
        d.sign * coalesce(d.score, 0), d.sign * (coalesce(d.score, 0) > 0),
        d.sign * (coalesce(d.score, 0) < 0), d.sign * (d.hint IS NOT NULL)
    FROM (SELECT -1 AS sign, OLD.score AS score, OLD.hint AS hint
          UNION ALL SELECT 1, score, hint FROM judgments
          WHERE id = (SELECT max(id) FROM judgments WHERE turn_id = OLD.turn_id)) AS d
    JOIN turns t ON t.id = OLD.turn_id
    WHERE true
    ON CONFLICT (minute) DO UPDATE SET judged = judged + excluded.judged, scored = scored + excluded.scored,
        score_sum = score_sum + excluded.score_sum, positive = positive + excluded.positive,
        negative = negative + excluded.negative, hinted = hinted + excluded.hinted;
    DELETE FROM reward_by_version WHERE judged = 0
        AND version = (SELECT coalesce(json_extract(versions, '$[0]'), 'v0') FROM turns
            WHERE id = OLD.turn_id);
    DELETE FROM reward_by_minute WHERE judged = 0
        AND minute = (SELECT CAST(created_at / 60 AS INTEGER) FROM turns WHERE id = OLD.turn_id);
END;

CREATE TRIGGER experiences_fts_delete AFTER DELETE ON experiences BEGIN
    INSERT INTO experiences_fts (experiences_fts, rowid, text) VALUES ('delete', OLD.id, OLD.text);
END;
"""

# A thinking answer (clawrl/chat/reasoning.py, `Turn.reasoning`): the text of its think block, NULL
# for an answer without one; and the chat template's extra variables its prompt was rendered with
# (`Turn.chat_template_kwargs`, JSON), NULL for none.
M019_TURN_REASONING = """
ALTER TABLE turns ADD COLUMN reasoning TEXT NULL;
ALTER TABLE turns ADD COLUMN chat_template_kwargs TEXT NULL;
"""

# The training steps that failed with a sample in their batch (clawrl/train/failures.py): a step
# that raises counts one for each sample it held, and a sample at its second is `skipped` with the
# exception's class and message ("failed step: ..."), so one that makes every step fail (a poison
# batch) cannot stall learning across the trainer's restarts.
M020_SAMPLE_ATTEMPTS = """
ALTER TABLE samples ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
"""

# An experience taught by its owner's own rating comment is injected from the next session on; one
# learnt from next messages alone waits until a second session teaches it (clawrl/memory/block.py).
# Existing rows start at 0: their source is not known, so they wait for two sessions too.
M021_EXPERIENCE_FROM_COMMENT = """
ALTER TABLE experiences ADD COLUMN from_comment INTEGER NOT NULL DEFAULT 0;
"""
