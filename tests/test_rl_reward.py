"""``longrm_jax.rl.reward_function``: our DisRM as the reward of TRL's GRPOTrainer, through a reward server
(``python -m longrm_jax.serve``) or loaded in process; both give ``RewardModel.score``'s rewards."""

import asyncio

import numpy as np
import pytest

from longrm_jax import RewardModel
from longrm_jax.rl import async_reward_function, reward_function
from helpers.tiny_checkpoint import make_tiny_model_dir
from test_serve import Server


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("rm")
    make_tiny_model_dir(path, "llama", "classifier", layers=1)
    server = Server(path, "--model-path", str(path), "--is-disrm", "--dtype", "float32")
    yield str(path), f"http://127.0.0.1:{server.port}"
    assert server.stop() == 0


def test_rewards_equal_reward_model_score_for_strings_and_chats(served):
    path, url = served
    prompts = ["Which door is blue?", [{"role": "user", "content": "Which door is red?"}]]
    completions = ["The left one.", [{"role": "assistant", "content": "The right one."}]]
    want = RewardModel.from_pretrained(path).score([prompts[0], prompts[1]], ["The left one.", "The right one."])
    for reward in (reward_function(url=url), reward_function(model_path=path)):
        got = reward(prompts=prompts, completions=completions, completion_ids=[[1], [2]], trainer_state=None)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    got = asyncio.run(async_reward_function(url=url)(prompts=prompts, completions=completions))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="exactly one"):
        reward_function()
    with pytest.raises(TypeError, match="a completion is a string"):
        reward_function(url=url)(prompts=["q"], completions=[5])


def test_grpo_trainer_runs_two_steps_with_the_server_as_its_reward(served, tmp_path):
    """TRL's GRPOTrainer on a tiny torch policy (CPU), rewarded by the server: 2 optimizer steps, every reward
    one of ours (finite)."""
    import datasets
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    _, url = served
    policy_dir = tmp_path / "policy"
    make_tiny_model_dir(policy_dir, "llama", "causal_lm", layers=1)
    policy = transformers.AutoModelForCausalLM.from_pretrained(policy_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(policy_dir)
    seen = []
    inner = reward_function(url=url)

    def reward(prompts, completions, **kwargs):
        rewards = inner(prompts, completions, **kwargs)
        seen.extend(rewards)
        return rewards

    data = datasets.Dataset.from_dict({"prompt": ["Which door is blue?", "Which door is red?"] * 4})
    config = GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4, num_generations=2,
                        max_completion_length=4, max_steps=2, learning_rate=1e-4, logging_steps=1, report_to=[],
                        use_cpu=True, save_strategy="no", bf16=False, seed=0)
    trainer = GRPOTrainer(model=policy, reward_funcs=reward, args=config, train_dataset=data,
                          processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(seen) >= 8 and all(np.isfinite(seen))
