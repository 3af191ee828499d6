/* graph.c - the oneDNN graph JSON op reader of the convgrad CLI (cJSON):
 * kind, typed attrs and logical tensors into a cgc_spec. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "graph.h"

static int cgc__json_int(const cJSON *n, int64_t *out) {
  if (!cJSON_IsNumber(n))
    return CG_EINVAL;
  double d = n->valuedouble;
  if (d < -9.0e15 || d > 9.0e15 || d != (double)(int64_t)d)
    return CG_EINVAL;
  *out = (int64_t)d;
  return 0;
}

static int cgc__json_list(const cJSON *arr, cgc_list *l, size_t max) {
  const cJSON *it;
  l->len = 0;
  if (!cJSON_IsArray(arr))
    return CG_EINVAL;
  cJSON_ArrayForEach(it, arr) {
    if (l->len >= max || cgc__json_int(it, &l->v[l->len]))
      return CG_EINVAL;
    l->len++;
  }
  return 0;
}

/* One attribute {"type": .., "value": ..} into s. */
static int cgc__graph_attr(const cJSON *a, cgc_spec *s, const char *path,
                           char *err, size_t errlen) {
  const char *name = a->string;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(a, "value");
  cgc_list *list = NULL;
  if (!v)
    return cg_errorf(err, errlen, CG_EINVAL, "%s: attrs.%s: no \"value\"", path,
                     name);
  if (!strcmp(name, "strides"))
    list = &s->strides;
  else if (!strcmp(name, "pads_begin"))
    list = &s->pads_begin;
  else if (!strcmp(name, "pads_end"))
    list = &s->pads_end;
  else if (!strcmp(name, "dilations"))
    list = &s->dilations;
  else if (!strcmp(name, "output_padding"))
    list = &s->output_padding;
  else if (!strcmp(name, "dst_shape") || !strcmp(name, "output_shape"))
    list = &s->dst_shape;
  else if (!strcmp(name, "weights_shape") || !strcmp(name, "filter_shape"))
    list = &s->weights_shape;
  if (list) {
    if (cgc__json_list(v, list, CG_MAX_ATTR_LEN))
      return cg_errorf(err, errlen, CG_EINVAL,
                       "%s: attrs.%s: expected a list of at most %d integers",
                       path, name, CG_MAX_ATTR_LEN);
    return 0;
  }
  if (!strcmp(name, "groups")) {
    if (cgc__json_int(v, &s->groups))
      return cg_errorf(err, errlen, CG_EINVAL,
                       "%s: attrs.groups: expected an integer", path);
    return 0;
  }
  const char *str = cJSON_GetStringValue(v);
  int rc = CG_EINVAL;
  if (!strcmp(name, "auto_pad"))
    rc = str ? cg_auto_pad_parse(str, &s->auto_pad) : CG_EINVAL;
  else if (!strcmp(name, "data_format"))
    rc = str ? cg_data_format_parse(str, &s->data_format) : CG_EINVAL;
  else if (!strcmp(name, "weights_format") || !strcmp(name, "filter_format"))
    rc = str ? cg_weights_format_parse(str, &s->weights_format) : CG_EINVAL;
  else
    return cg_errorf(err, errlen, CG_EINVAL, "%s: attrs.%s: unknown attribute",
                     path, name);
  if (rc)
    return cg_errorf(err, errlen, CG_EINVAL, "%s: attrs.%s: bad value '%s'",
                     path, name, str ? str : "(not a string)");
  return 0;
}

/* A logical tensor: its dtype and shape; stride must be dense. */
static int cgc__graph_tensor(const cJSON *t, const char *what, cg_dtype *dt,
                             cgc_list *shape, const char *path, char *err,
                             size_t errlen) {
  const cJSON *d = cJSON_GetObjectItemCaseSensitive(t, "dtype");
  if (!d)
    d = cJSON_GetObjectItemCaseSensitive(t, "data_type");
  const char *dn = cJSON_GetStringValue(d);
  if (!dn || cg_dtype_parse(dn, dt))
    return cg_errorf(err, errlen, CG_EINVAL,
                     "%s: %s: dtype '%s' is not f32, bf16 or f16", path, what,
                     dn ? dn : "(missing)");
  if (cgc__json_list(cJSON_GetObjectItemCaseSensitive(t, "shape"), shape,
                     CG_MAX_RANK))
    return cg_errorf(err, errlen, CG_EINVAL,
                     "%s: %s: shape must be a list of at most %d integers",
                     path, what, CG_MAX_RANK);
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(t, "stride");
  if (st) {
    cgc_list sl;
    if (cgc__json_list(st, &sl, CG_MAX_RANK) || sl.len != shape->len)
      return cg_errorf(err, errlen, CG_EINVAL,
                       "%s: %s: stride must have one value per dim", path,
                       what);
    int64_t want = 1;
    for (size_t i = shape->len; i-- > 0;) {
      /* Size-1 dims may carry any stride. */
      if (shape->v[i] != 1 && sl.v[i] != want)
        return cg_errorf(err, errlen, CG_EINVAL,
                         "%s: %s: strides are not dense row-major; only dense "
                         "tensors in the format's dim order are supported",
                         path, what);
      if (__builtin_mul_overflow(want, shape->v[i], &want))
        return cg_errorf(err, errlen, CG_EINVAL,
                         "%s: %s: the shape's element count overflows, so "
                         "its strides cannot be dense",
                         path, what);
    }
  }
  return 0;
}

/* Reads and parses the JSON file at path (at most 16 MiB) into *root. */
static int cgc__read_json(const char *path, cJSON **root, char *err,
                          size_t errlen) {
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return cg_errorf(err, errlen, CG_EINVAL, "%s: cannot open", path);
  long size = -1;
  if (fseek(fp, 0, SEEK_END) == 0)
    size = ftell(fp);
  if (size < 0 || size > (16L << 20) || fseek(fp, 0, SEEK_SET) != 0) {
    fclose(fp);
    return cg_errorf(err, errlen, CG_EINVAL,
                     "%s: unreadable or larger than 16 MiB", path);
  }
  char *text = malloc((size_t)size + 1);
  if (!text) {
    fclose(fp);
    return CG_ENOMEM;
  }
  size_t got = fread(text, 1, (size_t)size, fp);
  fclose(fp);
  int rc = 0;
  if (got != (size_t)size)
    rc = cg_errorf(err, errlen, CG_EINVAL, "%s: read failed", path);
  else if (!(*root = cJSON_ParseWithLength(text, (size_t)size)))
    rc = cg_errorf(err, errlen, CG_EINVAL, "%s: not valid JSON", path);
  free(text);
  return rc;
}

/* The index-th convolution-gradient op of root's "graph" array. */
static int cgc__graph_find_op(const cJSON *root, int index, const cJSON **op,
                              cg_op *kind, const char *path, char *err,
                              size_t errlen) {
  const cJSON *graph = cJSON_GetObjectItemCaseSensitive(root, "graph");
  if (!cJSON_IsArray(graph))
    return cg_errorf(err, errlen, CG_EINVAL,
                     "%s: no \"graph\" array (not a oneDNN graph JSON file)",
                     path);
  const cJSON *it;
  int seen = 0;
  cJSON_ArrayForEach(it, graph) {
    const char *k =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "kind"));
    if (k && cg_op_parse(k, kind) == 0 && seen++ == index) {
      *op = it;
      return 0;
    }
  }
  return cg_errorf(err, errlen, CG_EINVAL,
                   "%s: no convolution-gradient op number %d in \"graph\" "
                   "(found %d)",
                   path, index, seen);
}

/* The op's two inputs into s (dtype, ranks, dims), and the output's shape
 * where it pins the shape the op must produce. */
static int cgc__graph_tensors(const cJSON *op, cgc_spec *s, const char *path,
                              char *err, size_t errlen) {
  const cJSON *ins = cJSON_GetObjectItemCaseSensitive(op, "inputs");
  if (cJSON_GetArraySize(ins) < 2)
    return cg_errorf(err, errlen, CG_EINVAL, "%s: the op needs 2 inputs", path);
  int rc;
  for (int i = 0; i < 2; i++) {
    cg_dtype dt = CG_DTYPE_F32;
    cgc_list shape = {.len = 0};
    char what[32];
    snprintf(what, sizeof what, "inputs[%d]", i);
    rc = cgc__graph_tensor(cJSON_GetArrayItem(ins, i), what, &dt, &shape, path,
                           err, errlen);
    if (rc)
      return rc;
    if (i == 1 && dt != s->dtype)
      return cg_errorf(err, errlen, CG_EINVAL,
                       "%s: inputs[1]: dtype differs from inputs[0]", path);
    s->dtype = dt;
    s->rank[i] = (int)shape.len;
    memcpy(s->dims[i], shape.v, shape.len * sizeof(int64_t));
  }
  const cJSON *outs = cJSON_GetObjectItemCaseSensitive(op, "outputs");
  cgc_list *want = s->op == CG_OP_CONV_BWD_DATA   ? &s->dst_shape
                   : cg_op_outputs_weights(s->op) ? &s->weights_shape
                                                  : NULL;
  if (want && want->len == 0 && cJSON_GetArraySize(outs) >= 1) {
    cg_dtype dt;
    return cgc__graph_tensor(cJSON_GetArrayItem(outs, 0), "outputs[0]", &dt,
                             want, path, err, errlen);
  }
  return 0;
}

int cgc_graph_load(const char *path, int index, cgc_spec *s, char *err,
                   size_t errlen) {
  cJSON *root = NULL;
  const cJSON *op = NULL, *it;
  cg_op kind = CG_OP_INVALID;
  int rc = cgc__read_json(path, &root, err, errlen);
  if (!rc)
    rc = cgc__graph_find_op(root, index, &op, &kind, path, err, errlen);
  if (rc)
    goto out;
  cgc_spec_init(s);
  s->op = kind;
  const cJSON *attrs = cJSON_GetObjectItemCaseSensitive(op, "attrs");
  /* Only an object's members carry the attribute names read below. */
  if (attrs && !cJSON_IsObject(attrs)) {
    rc = cg_errorf(err, errlen, CG_EINVAL,
                   "%s: attrs must be an object {NAME: {\"type\": .., "
                   "\"value\": ..}}",
                   path);
    goto out;
  }
  cJSON_ArrayForEach(it, attrs) {
    if ((rc = cgc__graph_attr(it, s, path, err, errlen)) != 0)
      goto out;
  }
  rc = cgc__graph_tensors(op, s, path, err, errlen);
out:
  cJSON_Delete(root);
  return rc;
}
