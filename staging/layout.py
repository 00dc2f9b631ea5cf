"""Every offset and size of the 8 MiB staging region (CONTRACT §6), named once; import, never retype."""
from __future__ import annotations

REGION_BYTES = 8 * 1024 * 1024
POISON_BYTE = 0xA5                      # staging is filled with this at creation

INPUTS = 0x000000                       # 1024 × u32 input token ids
INPUTS_BYTES = 4096
TARGETS = 0x001000                      # 1024 × u32 target token ids
TARGETS_BYTES = 4096
INPUT_RECORD_BYTES = TARGETS + TARGETS_BYTES

SEMAPHORES = 0x010000                   # one 32-byte slot per plan submission
SEMAPHORE_SLOT_BYTES = 32
SEMAPHORE_RECORD_BYTES = 16
SLOT_FINAL_RELEASE = 0                  # within a slot: the fence the host waits for
SLOT_PRELAUNCH_RELEASE = 16             # within a slot: the pre-launch release
SUBMISSIONS = ("forward", "update", "final")   # plan submission index → name
SUBMISSION_FORWARD, SUBMISSION_UPDATE, SUBMISSION_FINAL = 0, 1, 2
SEMAPHORE_REGION_BYTES = SEMAPHORE_SLOT_BYTES * len(SUBMISSIONS)

ERROR_NOTIFIER = 0x010100
ERROR_NOTIFIER_BYTES = 64
DOORBELL = 0x010180                     # u32: sequence number of the issue being launched
DOORBELL_BYTES = 4

LOSS_BLOCK = 0x180000                   # four 4 KiB windows w0..w3
LOSS_WINDOW_BYTES = 4096
LOSS_WINDOW_WORDS = LOSS_WINDOW_BYTES // 4
LOSS_WINDOWS = 4
LOSS_BLOCK_BYTES = LOSS_WINDOW_BYTES * LOSS_WINDOWS
W0_LAST_CE, W1_EMBED_GRAD, W2_EMBED_FINAL, W3_EMBED_M_FINAL = range(LOSS_WINDOWS)

LOSS_RECORD = 0x190000                  # the update's per-row cross-entropy copy
LOSS_RECORD_BYTES = 4096
LOSS_BAD_ID = -1.0                      # a row the update's cross_entropy marks: its input or
#                                         target id is outside [0, V) (a true ce is ≥ 0)

PREDICTIONS = 0x1F0000                  # the prediction rows as {u32 token, u32 valid}
PREDICTION_COUNT = 3
PREDICTION_BYTES = 8
PREDICTIONS_BYTES = PREDICTION_COUNT * PREDICTION_BYTES

RECORD = 0x200000                       # result record: forward part then final part
RECORD_MARKER = bytes.fromhex("bebafecabebafeca")
RECORD_FORWARD_ROWS = PREDICTION_COUNT  # one logits row per prediction row

TRANSFER_WINDOW = 0x400000              # checkpoint chunks pass through here
TRANSFER_WINDOW_BYTES = 4 * 1024 * 1024


def record_forward_bytes(profile) -> int:
    """Forward part: fp32 logits of the three prediction rows (3·V·4 bytes; plan/profiles.py
    PREDICTION_ROWS names them: staging cannot import it)."""
    return RECORD_FORWARD_ROWS * profile.vocab * 4


def record_final_bytes(profile) -> int:
    """Final part: fp32 logits of the last prediction row after the final step (V·4 bytes)."""
    return profile.vocab * 4


def record_forward_offset(profile) -> int:
    return RECORD


def record_final_offset(profile) -> int:
    return RECORD + record_forward_bytes(profile)


def record_bytes(profile) -> int:
    return record_forward_bytes(profile) + record_final_bytes(profile)


def semaphore_slot(submission: int) -> int:
    """Offset of a plan submission's 32-byte semaphore slot."""
    return SEMAPHORES + SEMAPHORE_SLOT_BYTES * submission


def loss_window(index: int) -> int:
    return LOSS_BLOCK + LOSS_WINDOW_BYTES * index


def check_layout(profile) -> None:
    """Raise if a profile's record does not fit below the transfer window."""
    end = RECORD + record_bytes(profile)
    if end > TRANSFER_WINDOW:
        raise ValueError(f"profile {profile.name}: result record ends at {end:#x}, "
                         f"past the transfer window at {TRANSFER_WINDOW:#x}")


# ---- result file (CONTRACT §9): sizes reserved here; the section table is coppelius.staging.result_sections
STEP_WINDOW_BYTES = LOSS_RECORD_BYTES   # one step's per-row cross-entropy in the result file
STAT_RECORD_BYTES = 160
STATUS_BLOCK_BYTES = 160
TIMESTAMP_ENTRY_BYTES = 64
