"""Converts the weights of a BERT encoder exported to ONNX by Hugging Face's exporter into a
`model.safetensors` with the tensor names of the Hugging Face PyTorch checkpoint, the layout
`embatch-local-model` (candle's BERT) loads.

Usage: python onnx-bert-to-safetensors.py MODEL.onnx OUT.safetensors NUM_LAYERS

Needs the PyPI packages onnx, numpy and safetensors (scripts/fetch-model.sh installs pinned
versions into a throwaway virtual environment).

The exporter keeps the checkpoint's names for embeddings, biases and LayerNorms, but stores each
Linear layer's weight as an anonymous MatMul operand (`onnx::MatMul_1525`) of shape [in, out].
Such a weight gets its name from the MatMul node that uses it
(`/encoder/layer.0/attention/self/query/MatMul` -> `encoder.layer.0.attention.self.query.weight`)
and is transposed back to PyTorch's [out, in]. Values are copied exactly (float32 in, float32
out). Anything else (an unknown initializer, an operand used twice, a missing tensor) is an error:
a model this script does not understand is refused, never half-converted.
"""

import re
import sys

import numpy as np
import onnx
from onnx import numpy_helper
from safetensors.numpy import save_file

# Tensors of one encoder layer, as named in the PyTorch checkpoint.
LAYER_TENSORS = [
    "attention.self.query.weight",
    "attention.self.query.bias",
    "attention.self.key.weight",
    "attention.self.key.bias",
    "attention.self.value.weight",
    "attention.self.value.bias",
    "attention.output.dense.weight",
    "attention.output.dense.bias",
    "attention.output.LayerNorm.weight",
    "attention.output.LayerNorm.bias",
    "intermediate.dense.weight",
    "intermediate.dense.bias",
    "output.dense.weight",
    "output.dense.bias",
    "output.LayerNorm.weight",
    "output.LayerNorm.bias",
]
EMBEDDING_TENSORS = [
    "embeddings.word_embeddings.weight",
    "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight",
    "embeddings.LayerNorm.weight",
    "embeddings.LayerNorm.bias",
]
# `/encoder/layer.3/attention/output/dense/MatMul` -> `encoder.layer.3.attention.output.dense`
MATMUL_NODE = re.compile(r"^/((?:encoder/layer\.\d+/)[a-z_/]+)/MatMul$")


def expected_names(num_layers):
    names = list(EMBEDDING_TENSORS)
    for layer in range(num_layers):
        names += [f"encoder.layer.{layer}.{t}" for t in LAYER_TENSORS]
    return names


def convert(onnx_path, out_path, num_layers):
    graph = onnx.load(onnx_path).graph
    initializers = {t.name: t for t in graph.initializer}
    expected = set(expected_names(num_layers))
    tensors = {}

    # Linear weights: anonymous MatMul operands, named after their node.
    for node in graph.node:
        if node.op_type != "MatMul":
            continue
        operands = [name for name in node.input if name in initializers]
        if not operands:
            continue  # activations times activations (attention scores)
        match = MATMUL_NODE.match(node.name)
        if len(operands) != 1 or node.input[1] != operands[0] or not match:
            sys.exit(f"error: unexpected MatMul node {node.name!r} with inputs {list(node.input)}")
        name = match.group(1).replace("/", ".") + ".weight"
        if name not in expected or name in tensors:
            sys.exit(f"error: MatMul node {node.name!r} gives an unexpected tensor {name!r}")
        weight = numpy_helper.to_array(initializers.pop(operands[0]))
        tensors[name] = np.ascontiguousarray(weight.T)

    # Everything else keeps its checkpoint name.
    for name, initializer in initializers.items():
        if name not in expected or name in tensors:
            sys.exit(f"error: unexpected initializer {name!r} in {onnx_path}")
        tensors[name] = numpy_helper.to_array(initializer)

    missing = sorted(expected - tensors.keys())
    if missing:
        sys.exit(f"error: {onnx_path} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    for name, array in tensors.items():
        if array.dtype != np.float32:
            sys.exit(f"error: {name} is {array.dtype}, expected float32")
    save_file(tensors, out_path, metadata={"format": "pt"})
    print(f"wrote {len(tensors)} tensors to {out_path}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    convert(sys.argv[1], sys.argv[2], int(sys.argv[3]))
