# tests/server: the C unit tests (test_*.c: stop strings, request validation,
# SSE and HTTP framing) are picked up by tests/CMakeLists.txt and linked
# with petrel_server.  This file adds the end-to-end suite: the official
# OpenAI npm client, raw fetch and curl against a real `petrel serve` from
# this build (tests/server/e2e/run.sh runs every *.test.mjs: e2e, preempt,
# and hardening: empty API keys, slow clients, `ulimit -n 64`, DNS
# rebinding, CORS, Content-Type; sdk: the Vercel AI SDK, LangChain.js and
# openai with structured output, tools, n > 1 and reasoning, outputs
# validated with zod and ajv; metrics: /metrics parsed by a Prometheus text
# parser, its counters equal to the usage the clients got, and /health while
# the model loads; pool: several models from one endpoint, interleaved
# requests equal to each model alone, eviction with requests in flight,
# a bounded wait for a load; families: Gemma 2/3, Qwen3-MoE and gpt-oss
# served from the transformers fixtures with their real chat templates),
# with the load test at 64 concurrent
# streaming clients, or 8 in the sanitizer build where each is much slower.
if(PETREL_SANITIZE)
  set(e2e_clients 8)
  set(e2e_env "E2E_SANITIZED=1")
else()
  set(e2e_clients 64)
  set(e2e_env "E2E_SANITIZED=0")
endif()
add_test(NAME server/e2e
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/e2e/run.sh ${CMAKE_BINARY_DIR}/e2e-server
                 $<TARGET_FILE:petrel> ${e2e_clients})
set_tests_properties(server/e2e PROPERTIES
  SKIP_RETURN_CODE 77 TIMEOUT 1200 LABELS e2e ENVIRONMENT "${e2e_env}")

