"""py-spy's output read into threads, stacks and roles (harness.profiling), on recorded text."""
from harness.profiling import Frame, ThreadProfile, merged, parse_raw, roles

RAW = """thread (101): Thread-2 (_run_generation_loop);Thread.run (threading.py:982);ContinuousBatchingManager._generation_loop_body (transformers/generation/continuous_batching/continuous_api.py:850);LlamaModel.forward (transformers/models/llama/modeling_llama.py:400) 30
thread (101): Thread-2 (_run_generation_loop);Thread.run (threading.py:982);ContinuousBatchingManager._generation_loop_body (transformers/generation/continuous_batching/continuous_api.py:860) 10
thread (102): tritonfront-generation;Thread.run (threading.py:982);GenerationLoop._run (tritonfront/core/generation_loop.py:270);HFEngine.outputs (tritonfront/engines/hf/engine.py:500);ContinuousBatchingManager.get_result (transformers/generation/continuous_batching/continuous_api.py:700) 5
thread (103);_find_and_load (<frozen importlib._bootstrap>:1176) 2
"""
RULES = [("loop", lambda f: f.function.endswith("._run") and f.file.endswith("generation_loop.py")),
         ("engine", lambda f: "continuous_batching" in f.file)]


def test_raw_lines_become_threads_with_their_stacks_and_counts():
    threads = parse_raw(RAW)
    assert sorted(threads) == [101, 102, 103]
    assert threads[101].name == "Thread-2 (_run_generation_loop)" and threads[101].samples == 40
    assert threads[103].name == "" and threads[103].samples == 2
    innermost = max(threads[101].stacks, key=threads[101].stacks.get)[-1]
    assert innermost == Frame("LlamaModel.forward", "transformers/models/llama/modeling_llama.py")


def test_roles_follow_the_first_rule_most_samples_pass():
    # The loop thread also passes through continuous_batching (it waits in the engine's queue):
    # the rule order decides.
    assert roles(parse_raw(RAW), RULES) == {101: "engine", 102: "loop", 103: "other Python threads"}


def test_merged_adds_the_stacks_of_several_sources_per_thread():
    stack = (Frame("GenerationLoop._run", "tritonfront/core/generation_loop.py"),)
    dump = {102: ThreadProfile("tritonfront-generation", __import__("collections").Counter({stack: 1})),
            104: ThreadProfile("tritonfront-gauges")}
    threads = merged(parse_raw(RAW), dump)
    assert threads[102].samples == 6 and threads[104].name == "tritonfront-gauges" and 101 in threads
