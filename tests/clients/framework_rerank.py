"""A framework's reranker against a running embatch stack (started by scripts/client-tests.sh).

Usage: python framework_rerank.py GATEWAY_URL

LlamaIndex's `CohereRerank` node postprocessor (llama-index-postprocessor-cohere-rerank, pinned
in tests/clients/requirements-frameworks.txt), pointed at the gateway by `base_url` alone: it
must keep the `top_n` best nodes, best first, each scored exactly as TEI's own route
(POST /models/<reranker>/rerank) scores it. Prints one PASS/FAIL line; exits 1 on failure.
"""

import sys

from test_clients import DOCUMENTS, QUERY, RERANKER, run_checks, tei_rerank_scores


def check_llama_index_cohere_rerank(gateway: str) -> str:
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    reranker = CohereRerank(api_key="unused", model=RERANKER, top_n=2, base_url=gateway)
    nodes = [NodeWithScore(node=TextNode(text=text, id_=str(i))) for i, text in enumerate(DOCUMENTS)]
    kept = reranker.postprocess_nodes(nodes, query_bundle=QueryBundle(QUERY))
    got = [(int(n.node.node_id), n.score) for n in kept]
    expected = tei_rerank_scores(gateway)
    best = sorted(expected.items(), key=lambda item: item[1], reverse=True)[:2]
    assert got == best, f"got {got}, want {best}"
    return f"kept {len(got)} of {len(DOCUMENTS)} nodes, best {got[0][0]} at {got[0][1]:.4f}, equal to POST /rerank's"


CHECKS = [
    ("llama-index-postprocessor-cohere-rerank",
     "CohereRerank(base_url).postprocess_nodes(nodes, query)", check_llama_index_cohere_rerank),
]

if __name__ == "__main__":
    sys.exit(run_checks(CHECKS, (sys.argv[1].rstrip("/"),), "framework reranker"))
