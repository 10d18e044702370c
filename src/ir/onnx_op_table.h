// The one list of ONNX-semantics IR ops (the "onnx dialect").
//
// These ops mean exactly what the ONNX operator of the same name means
// (broadcasting, negative axes, optional inputs), so an imported graph can
// be run op by op before any pass has fused it. They expand into the same
// ir::OpKind enum as the fused ops of op_table.h, after them, so one graph
// can hold both and passes can rewrite onnx.* into fused ops.
//
// The list is expanded (X-macro) in:
//   ir/onnx_shape_rules.cc              -> infer_<op>()  dynamic shape rule
//   runtime/interp/onnx_ref_*.cc        -> ref_<op>()    scalar reference kernel
//   tests/runtime/interp/test_onnx_conformance.cc -> every op must pass at
//                                          least one ONNX node test or a
//                                          generated test
// so adding an op without its pieces fails to compile (or to test).
//
// X(Enum, "onnx.OpType"). Constant, Identity and Dropout are importable but
// not listed: the importer turns Constant into weights and drops the other two.
#pragma once

#define K3_ONNX_OP_LIST(X)                                    \
  /* Elementwise arithmetic (broadcasting) */                 \
  X(OnnxAdd, "onnx.Add")                                      \
  X(OnnxSub, "onnx.Sub")                                      \
  X(OnnxMul, "onnx.Mul")                                      \
  X(OnnxDiv, "onnx.Div")                                      \
  X(OnnxPow, "onnx.Pow")                                      \
  X(OnnxMod, "onnx.Mod")                                      \
  X(OnnxMax, "onnx.Max")                                      \
  X(OnnxMin, "onnx.Min")                                      \
  /* Elementwise unary */                                     \
  X(OnnxSqrt, "onnx.Sqrt")                                    \
  X(OnnxReciprocal, "onnx.Reciprocal")                        \
  X(OnnxNeg, "onnx.Neg")                                      \
  X(OnnxAbs, "onnx.Abs")                                      \
  X(OnnxExp, "onnx.Exp")                                      \
  X(OnnxLog, "onnx.Log")                                      \
  X(OnnxErf, "onnx.Erf")                                      \
  X(OnnxTanh, "onnx.Tanh")                                    \
  X(OnnxSigmoid, "onnx.Sigmoid")                              \
  X(OnnxRelu, "onnx.Relu")                                    \
  X(OnnxGelu, "onnx.Gelu")                                    \
  X(OnnxCos, "onnx.Cos")                                      \
  X(OnnxSin, "onnx.Sin")                                      \
  X(OnnxFloor, "onnx.Floor")                                  \
  X(OnnxCeil, "onnx.Ceil")                                    \
  X(OnnxClip, "onnx.Clip")                                    \
  /* Comparison and logic (bool results) */                   \
  X(OnnxEqual, "onnx.Equal")                                  \
  X(OnnxLess, "onnx.Less")                                    \
  X(OnnxLessOrEqual, "onnx.LessOrEqual")                      \
  X(OnnxGreater, "onnx.Greater")                              \
  X(OnnxGreaterOrEqual, "onnx.GreaterOrEqual")                \
  X(OnnxNot, "onnx.Not")                                      \
  X(OnnxAnd, "onnx.And")                                      \
  X(OnnxOr, "onnx.Or")                                        \
  X(OnnxWhere, "onnx.Where")                                  \
  /* Linear algebra, normalization, reductions */             \
  X(OnnxMatMul, "onnx.MatMul")                                \
  X(OnnxGemm, "onnx.Gemm")                                    \
  X(OnnxSoftmax, "onnx.Softmax")                              \
  X(OnnxLogSoftmax, "onnx.LogSoftmax")                        \
  X(OnnxLayerNormalization, "onnx.LayerNormalization")        \
  X(OnnxRMSNormalization, "onnx.RMSNormalization")            \
  X(OnnxReduceMean, "onnx.ReduceMean")                        \
  X(OnnxReduceSum, "onnx.ReduceSum")                          \
  X(OnnxReduceMax, "onnx.ReduceMax")                          \
  X(OnnxArgMax, "onnx.ArgMax")                                \
  X(OnnxTopK, "onnx.TopK")                                    \
  X(OnnxTrilu, "onnx.Trilu")                                  \
  /* Indexing */                                              \
  X(OnnxGather, "onnx.Gather")                                \
  X(OnnxGatherElements, "onnx.GatherElements")                \
  X(OnnxGatherND, "onnx.GatherND")                            \
  X(OnnxScatterND, "onnx.ScatterND")                          \
  X(OnnxScatterElements, "onnx.ScatterElements")              \
  X(OnnxNonZero, "onnx.NonZero")                              \
  /* Layout and shape arithmetic */                           \
  X(OnnxConcat, "onnx.Concat")                                \
  X(OnnxSlice, "onnx.Slice")                                  \
  X(OnnxSplit, "onnx.Split")                                  \
  X(OnnxReshape, "onnx.Reshape")                              \
  X(OnnxTranspose, "onnx.Transpose")                          \
  X(OnnxUnsqueeze, "onnx.Unsqueeze")                          \
  X(OnnxSqueeze, "onnx.Squeeze")                              \
  X(OnnxFlatten, "onnx.Flatten")                              \
  X(OnnxExpand, "onnx.Expand")                                \
  X(OnnxTile, "onnx.Tile")                                    \
  X(OnnxShape, "onnx.Shape")                                  \
  X(OnnxSize, "onnx.Size")                                    \
  X(OnnxCast, "onnx.Cast")                                    \
  X(OnnxCastLike, "onnx.CastLike")                            \
  X(OnnxRange, "onnx.Range")                                  \
  X(OnnxConstantOfShape, "onnx.ConstantOfShape")              \
  /* K3 ops with ONNX-style shapes (docs/onnx-lowering.md) */ \
  X(K3Rope, "k3.Rope")                                        \
  X(K3Attention, "k3.Attention")                              \
  X(K3Moe, "k3.Moe")                                          \
  X(K3NormAct, "k3.NormAct")
