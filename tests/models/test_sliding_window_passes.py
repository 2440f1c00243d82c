"""The trainer's own pre-update pass on a sliding-window model equals each row run alone.

Today's shared-prompt pass gives Mistral (sliding window 8) log-probs 0.5 nats away on rows longer than the
window. The per-batch check (:func:`lit_entropy.policy.model_support.allow_shared_prompts`) sends such batches to
whole rows; this test passes once the shared-prompt passes call it.
"""

from __future__ import annotations

import torch

from lit_entropy.iteration import prepare_update
from lit_entropy.module import PolicyModule
from lit_entropy.policy.models import PolicyBundle
from lit_entropy.rollout.batch import RolloutBatch
from tests.models import trainer_paths as tp
from tests.models.families import grouped_rows, tiny_model


def test_pre_update_pass_on_a_sliding_window_model_equals_each_row_alone():
    model = tiny_model("mistral")
    rows = grouped_rows()
    with torch.no_grad():
        reference, _ = tp.unpadded(model, rows)
    module = PolicyModule(PolicyBundle(model, None, ""), temperature=tp.TEMPERATURE, share_prompts=True)
    module.to(tp.device_of(model))  # the batch stays on the CPU, as the trainer's do
    batch = RolloutBatch(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"].bool(),
                         response_mask=rows["response_mask"], rewards=torch.linspace(0, 1, len(rows["input_ids"])),
                         group_index=rows["group_index"], group_size=3,
                         sampler_logp=torch.where(rows["response_mask"], reference.cpu(), 0.0))  # an exact sampler
    prepare_update(module, batch)
    assert tp.max_diff(batch.old_logp, reference, rows["response_mask"]) <= 1e-5
