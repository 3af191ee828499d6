/* bdesc.c - oneDNN benchdnn convolution/deconvolution descriptors: the
 * parser (benchdnn's str2desc + sanitize_desc + init_pad_r rules, as
 * described in oneDNN's tests/benchdnn/doc/knobs_desc.md) and the mapping of
 * a descriptor to a cg_problem for each gradient op. */
#include <inttypes.h>
#include <string.h>

#include "cg/bdesc.h"
#include "layout.h"

#define LLD PRId64

/* One spatial axis as written: each value with a "given" flag. */
typedef struct {
  int64_t v[6];
  int has[6];
} axis;

enum { AX_I, AX_O, AX_K, AX_S, AX_P, AX_D };

static const char axis_keys[] = "iokspd"; /* index = AX_* */
static const char axis_names[] = "dhw";

static int is_end(char c) {
  return c == '\0' || c == '\n' || c == '\r';
}

/* Copies the name after 'n': surrounding quotes and trailing blanks go. */
static void copy_name(const char *s, char *out, size_t cap) {
  size_t n = 0;
  while (!is_end(s[n]))
    n++;
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
    n--;
  if (n >= 2 && s[0] == '"' && s[n - 1] == '"') {
    s++;
    n -= 2;
  }
  if (n >= cap) /* a label only: keep what fits */
    n = cap - 1;
  memcpy(out, s, n);
  out[n] = '\0';
}

/* Reads one "key value" token at *ps into the right slot. */
static int read_token(const char **ps, int64_t *mb, int64_t *g, int64_t *ic,
                      int64_t *oc, int has_top[4], axis ax[3], char *err,
                      size_t errlen) {
  const char *s = *ps, *start = s;
  char key[3] = {0};
  int klen = 0;
  while (*s >= 'a' && *s <= 'z') {
    if (klen == 2)
      return cg_errorf(err, errlen, CG_EINVAL,
                       "descriptor: unknown key \"%.3s\" at offset %d", start,
                       (int)(s - *ps));
    key[klen++] = *s++;
  }
  if (klen == 0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "descriptor: unexpected '%c' where a key was expected",
                     *s);
  if (*s < '0' || *s > '9')
    return cg_errorf(err, errlen, CG_EINVAL,
                     "descriptor: key \"%s\" needs a non-negative integer",
                     key);
  int64_t v = 0;
  while (*s >= '0' && *s <= '9') {
    v = v * 10 + (*s++ - '0');
    if (v > CG_MAX_DIM)
      return cg_errorf(err, errlen, CG_EINVAL,
                       "descriptor: %s value exceeds %" LLD, key, CG_MAX_DIM);
  }
  int64_t *slot = NULL;
  int *has = NULL;
  if (strcmp(key, "mb") == 0)
    slot = mb, has = &has_top[0];
  else if (strcmp(key, "g") == 0)
    slot = g, has = &has_top[1];
  else if (strcmp(key, "ic") == 0)
    slot = ic, has = &has_top[2];
  else if (strcmp(key, "oc") == 0)
    slot = oc, has = &has_top[3];
  else if (klen == 2) {
    const char *f = strchr(axis_keys, key[0]);
    const char *a = strchr(axis_names, key[1]);
    if (f != NULL && a != NULL) {
      axis *x = &ax[a - axis_names];
      slot = &x->v[f - axis_keys];
      has = &x->has[f - axis_keys];
    }
  }
  if (slot == NULL)
    return cg_errorf(err, errlen, CG_EINVAL, "descriptor: unknown key \"%s\"",
                     key);
  if (*has)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "descriptor: key \"%s\" given twice", key);
  *slot = v;
  *has = 1;
  *ps = s;
  return 0;
}

/* benchdnn's "axis exists" test: any size, kernel or dilation, a stride
 * other than 1 or a padding of at least 1. */
static int axis_present(const axis *x) {
  return x->has[AX_I] || x->has[AX_O] || x->has[AX_K] ||
         (x->has[AX_D] && x->v[AX_D] != 0) ||
         (x->has[AX_S] && x->v[AX_S] != 1) || (x->has[AX_P] && x->v[AX_P] >= 1);
}

/* Completes one axis: default stride/dilation, derived output size or
 * begin padding, derived end padding clamped at 0. */
static int finish_axis(const axis *x, char name, int deconv, int d,
                       cg_bdesc *out, char *err, size_t errlen) {
  if (!x->has[AX_I] || !x->has[AX_K])
    return cg_errorf(err, errlen, CG_EINVAL,
                     "descriptor: i%c and k%c are required for the %c axis",
                     name, name, name);
  int64_t i = x->v[AX_I], k = x->v[AX_K];
  int64_t s = x->has[AX_S] ? x->v[AX_S] : 1;
  int64_t dil = x->has[AX_D] ? x->v[AX_D] : 0;
  if (i <= 0 || k <= 0 || s <= 0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "descriptor: i%c, k%c and s%c must be > 0", name, name,
                     name);
  int64_t ek = (k - 1) * (dil + 1) + 1;
  int64_t o, p;
  /* Integer division truncates toward zero, as in benchdnn (C++). */
  if (!x->has[AX_O]) {
    p = x->has[AX_P] ? x->v[AX_P] : 0;
    o = deconv ? (i - 1) * s + ek - 2 * p : (i - ek + 2 * p) / s + 1;
  } else {
    o = x->v[AX_O];
    p = x->has[AX_P] ? x->v[AX_P]
                     : (deconv ? ((i - 1) * s - o + ek) / 2
                               : ((o - 1) * s - i + ek) / 2);
  }
  if (o <= 0 || o > CG_MAX_DIM)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "descriptor: o%c = %" LLD " is out of range", name, o);
  if (p < 0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "descriptor: derived p%c = %" LLD " is negative", name, p);
  int64_t pr = deconv ? (i - 1) * s - o + ek - p : (o - 1) * s - i + ek - p;
  out->in_sp[d] = i;
  out->out_sp[d] = o;
  out->kernel[d] = k;
  out->stride[d] = s;
  out->dilation[d] = dil + 1;
  out->pad_begin[d] = p;
  /* The graph API rejects negative pads; with pads_end 0 the floor in the
   * Convolution relation (or ConvTranspose's output_padding) absorbs it. */
  out->pad_end[d] = pr > 0 ? pr : 0;
  return 0;
}

int cg_bdesc_parse(const char *text, int deconv, cg_bdesc *out, char *err,
                   size_t errlen) {
  cg_bdesc d;
  axis ax[3];
  int64_t mb = 2, g = 1, ic = 0, oc = 0;
  int has_top[4] = {0}, rc = 0;
  memset(&d, 0, sizeof(d));
  memset(ax, 0, sizeof(ax));
  if (err != NULL && errlen > 0)
    err[0] = '\0';
  if (text == NULL)
    return cg_errorf(err, errlen, CG_EINVAL, "descriptor: NULL");

  const char *s = text;
  while (!is_end(*s)) {
    if (*s == '_' || *s == ' ' || *s == '\t') {
      s++;
      continue;
    }
    if (*s == 'n') {
      copy_name(s + 1, d.name, sizeof(d.name));
      break;
    }
    if ((rc = read_token(&s, &mb, &g, &ic, &oc, has_top, ax, err, errlen)))
      return rc;
  }
  if (!has_top[2] || !has_top[3])
    return cg_errorf(err, errlen, CG_EINVAL,
                     "descriptor: ic and oc are required");
  if (mb <= 0 || g <= 0 || ic <= 0 || oc <= 0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "descriptor: mb, g, ic and oc must be > 0");
  if (ic % g != 0 || oc % g != 0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "descriptor: ic %" LLD " and oc %" LLD
                     " must be divisible by g %" LLD,
                     ic, oc, g);

  int pd = axis_present(&ax[0]), ph = axis_present(&ax[1]),
      pw = axis_present(&ax[2]);
  if (!pd && !ph && !pw)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "descriptor: no spatial sizes (need iw, ih or id)");
  /* Rank from the highest axis; missing lower axes copy the higher one. */
  if (pd) {
    if (ph != pw)
      return cg_errorf(err, errlen, CG_EINVAL,
                       "descriptor: 3D needs both or neither of h and w");
    if (!ph)
      ax[1] = ax[2] = ax[0];
    d.nsp = 3;
  } else if (ph) {
    if (!pw)
      ax[2] = ax[1];
    d.nsp = 2;
  } else {
    d.nsp = 1;
  }
  for (int a = 3 - d.nsp, i = 0; a < 3; a++, i++)
    if ((rc = finish_axis(&ax[a], axis_names[a], deconv, i, &d, err, errlen)))
      return rc;
  d.deconv = deconv ? 1 : 0;
  d.g = g;
  d.mb = mb;
  d.ic = ic;
  d.oc = oc;
  *out = d;
  return 0;
}

int cg_bdesc_parse_line(const char *line, cg_bdesc *out, int *is_problem,
                        char *err, size_t errlen) {
  int deconv = 0;
  *is_problem = 0;
  if (line == NULL)
    return cg_errorf(err, errlen, CG_EINVAL, "descriptor: NULL");
  while (*line == ' ' || *line == '\t')
    line++;
  if (is_end(*line) || *line == '#')
    return 0;
  if (strncmp(line, "deconv:", 7) == 0) {
    deconv = 1;
    line += 7;
  } else if (strncmp(line, "conv:", 5) == 0) {
    line += 5;
  }
  int rc = cg_bdesc_parse(line, deconv, out, err, errlen);
  if (rc == 0)
    *is_problem = 1;
  return rc;
}

int cg_bdesc_problem_init(cg_bdesc_problem *out, const cg_bdesc *d, cg_op op,
                          cg_dtype dtype, cg_data_format data_format,
                          cg_weights_format weights_format, char *err,
                          size_t errlen) {
  int deconv_op = op == CG_OP_DECONV_BWD_DATA ||
                  op == CG_OP_DECONV_BWD_WEIGHTS || op == CG_OP_DECONV_BWD;
  if (op < 1 || op > CG_OP_ALL_COUNT)
    return cg_errorf(err, errlen, CG_EINVAL, "op: invalid value %d", (int)op);
  if (deconv_op != (d->deconv != 0))
    return cg_errorf(
        err, errlen, CG_EINVAL, "op: %s does not belong to a %s descriptor",
        cg_op_name(op), d->deconv ? "deconvolution" : "convolution");
  if (d->nsp < 1 || d->nsp > CG_MAX_SPATIAL)
    return cg_errorf(err, errlen, CG_EINVAL, "descriptor: bad spatial rank %d",
                     d->nsp);
  memset(out, 0, sizeof(*out));
  cg_problem *p = &out->problem;
  cg_problem_init(p);
  p->op = op;
  p->dtype = dtype;
  p->attrs.groups = d->g;
  p->attrs.data_format = data_format;
  p->attrs.weights_format = weights_format;
  cg_data_format df =
      data_format == CG_DATA_DEFAULT ? CG_DATA_NXC : data_format;
  int nsp = d->nsp, rank = nsp + 2;
  for (int i = 0; i < nsp; i++) {
    out->strides[i] = d->stride[i];
    out->dilations[i] = d->dilation[i];
    out->pads_begin[i] = d->pad_begin[i];
    out->pads_end[i] = d->pad_end[i];
  }
  p->attrs.strides = (cg_ints){out->strides, (size_t)nsp};
  p->attrs.dilations = (cg_ints){out->dilations, (size_t)nsp};
  p->attrs.pads_begin = (cg_ints){out->pads_begin, (size_t)nsp};
  p->attrs.pads_end = (cg_ints){out->pads_end, (size_t)nsp};

  /* Forward input (mb, ic, I), forward output (mb, oc, O), weights. */
  int64_t src[CG_MAX_RANK], dst[CG_MAX_RANK], w[CG_MAX_RANK];
  cg__data_dims(df, nsp, d->mb, d->ic, d->in_sp, src);
  cg__data_dims(df, nsp, d->mb, d->oc, d->out_sp, dst);
  cg__weights_dims(op, weights_format, nsp, d->oc, d->ic, d->g, d->kernel, w);
  size_t bytes = sizeof(int64_t) * (size_t)rank;
  if (cg_op_is_layer(op)) {
    /* src, diff_dst and the weights as the third input. */
    memcpy(out->dims[0], src, bytes);
    memcpy(out->dims[1], dst, bytes);
    memcpy(out->shape, w, bytes);
    p->input_dims[2] = (cg_ints){out->shape, (size_t)rank};
  } else if (cg_op_outputs_weights(op)) {
    memcpy(out->dims[0], src, bytes);
    memcpy(out->dims[1], dst, bytes);
    memcpy(out->shape, w, bytes);
    p->attrs.weights_shape = (cg_ints){out->shape, (size_t)rank};
  } else {
    memcpy(out->dims[0], dst, bytes);
    memcpy(out->dims[1], w, bytes);
    /* ConvolutionBackwardData gets the exact diff_src size: with a clamped
     * end padding, inference alone could give a smaller one. */
    if (op == CG_OP_CONV_BWD_DATA) {
      memcpy(out->shape, src, bytes);
      p->attrs.dst_shape = (cg_ints){out->shape, (size_t)rank};
    }
  }
  p->input_dims[0] = (cg_ints){out->dims[0], (size_t)rank};
  p->input_dims[1] = (cg_ints){out->dims[1], (size_t)rank};
  return 0;
}

/* Where the descriptor of a run line ends: at the first blank-separated
 * word holding '=' outside quotes (a name n"..." may hold blanks). */
static size_t descriptor_length(const char *line) {
  size_t word = 0;
  int quoted = 0;
  for (size_t i = 0; !is_end(line[i]); i++) {
    char c = line[i];
    if (c == '"')
      quoted = !quoted;
    else if (!quoted && (c == ' ' || c == '\t'))
      word = i + 1;
    else if (!quoted && c == '=')
      return word;
  }
  return strlen(line);
}

/* Applies one "key=value" word of a run line to out. */
static int apply_option(const char *word, size_t n, cg_bdesc_run *out,
                        char *err, size_t errlen) {
  char buf[64];
  if (n >= sizeof(buf))
    return cg_errorf(err, errlen, CG_EINVAL, "option \"%.20s...\" is too long",
                     word);
  memcpy(buf, word, n);
  buf[n] = '\0';
  char *value = strchr(buf, '=');
  if (value == NULL)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "\"%s\": expected OPTION=VALUE after the descriptor", buf);
  *value++ = '\0';
  int rc;
  if (strcmp(buf, "op") == 0)
    rc = cg_op_parse(value, &out->op);
  else if (strcmp(buf, "dtype") == 0)
    rc = cg_dtype_parse(value, &out->dtype);
  else if (strcmp(buf, "data_format") == 0)
    rc = cg_data_format_parse(value, &out->data_format);
  else if (strcmp(buf, "weights_format") == 0)
    rc = cg_weights_format_parse(value, &out->weights_format);
  else
    return cg_errorf(err, errlen, CG_EINVAL,
                     "unknown option \"%s\" (op, dtype, data_format, "
                     "weights_format)",
                     buf);
  if (rc != 0)
    return cg_errorf(err, errlen, CG_EINVAL, "%s: invalid value \"%s\"", buf,
                     value);
  return 0;
}

int cg_bdesc_parse_run(const char *line, cg_bdesc_run *out, int *is_problem,
                       char *err, size_t errlen) {
  char desc[512];
  *is_problem = 0;
  if (line == NULL)
    return cg_errorf(err, errlen, CG_EINVAL, "descriptor: NULL");
  size_t n = descriptor_length(line);
  if (n >= sizeof(desc))
    return cg_errorf(err, errlen, CG_EINVAL,
                     "descriptor: longer than %zu characters",
                     sizeof(desc) - 1);
  memcpy(desc, line, n);
  desc[n] = '\0';
  int rc = cg_bdesc_parse_line(desc, &out->desc, is_problem, err, errlen);
  if (rc != 0 || !*is_problem) {
    if (rc == 0 && !is_end(line[n]) && line[n] != '#')
      rc = cg_errorf(err, errlen, CG_EINVAL, "options without a descriptor");
    return rc;
  }
  out->op = out->desc.deconv ? CG_OP_DECONV_BWD : CG_OP_CONV_BWD;
  out->dtype = CG_DTYPE_F32;
  out->data_format = CG_DATA_DEFAULT;
  out->weights_format = CG_WEIGHTS_DEFAULT;
  const char *s = line + n;
  while (!is_end(*s) && *s != '#') {
    size_t w = strcspn(s, " \t\r\n#");
    if (w > 0 && (rc = apply_option(s, w, out, err, errlen)) != 0) {
      *is_problem = 0;
      return rc;
    }
    s += w;
    s += strspn(s, " \t");
  }
  return 0;
}
