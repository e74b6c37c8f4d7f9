/* code.c: looks inside a build's output for its kernel entries, so that a
 * builder without a GPU (a CI box) still refuses to publish a bundle whose
 * manifest names a kernel the code does not define. Bounds are checked on
 * every read: the bytes come from a child process. */
#include <elf.h>
#include <string.h>

#include "gpu_internal.h"

/* True if the NUL-terminated string at strtab[off] (within size) is name. */
static int strtab_is(const unsigned char *strtab, size_t size, size_t off,
                     const char *name) {
  size_t n = strlen(name);
  return off < size && size - off > n && memcmp(strtab + off, name, n) == 0 &&
         strtab[off + n] == '\0';
}

static int section(const unsigned char *elf, size_t len, const Elf64_Ehdr *eh,
                   size_t i, Elf64_Shdr *out) {
  if (i >= eh->e_shnum || eh->e_shoff > len ||
      (len - eh->e_shoff) / sizeof *out <= i)
    return -1;
  memcpy(out, elf + eh->e_shoff + i * sizeof *out, sizeof *out);
  return out->sh_offset <= len && len - out->sh_offset >= out->sh_size ? 0 : -1;
}

static int symtab_has(const unsigned char *elf, size_t len,
                      const Elf64_Ehdr *eh, const Elf64_Shdr *symtab,
                      const char *name) {
  Elf64_Shdr strtab;
  if (section(elf, len, eh, symtab->sh_link, &strtab) != 0)
    return 0;
  size_t n = symtab->sh_size / sizeof(Elf64_Sym);
  for (size_t i = 0; i < n; i++) {
    Elf64_Sym sym;
    memcpy(&sym, elf + symtab->sh_offset + i * sizeof sym, sizeof sym);
    if (ELF64_ST_TYPE(sym.st_info) == STT_FUNC &&
        strtab_is(elf + strtab.sh_offset, strtab.sh_size, sym.st_name, name))
      return 1;
  }
  return 0;
}

static int cubin_has(const unsigned char *elf, size_t len, const char *name) {
  Elf64_Ehdr eh;
  if (len < sizeof eh || memcmp(elf, ELFMAG, SELFMAG) != 0 ||
      elf[EI_CLASS] != ELFCLASS64)
    return 0;
  memcpy(&eh, elf, sizeof eh);
  if (eh.e_shentsize != sizeof(Elf64_Shdr))
    return 0;
  for (size_t i = 0; i < eh.e_shnum; i++) {
    Elf64_Shdr sh;
    if (section(elf, len, &eh, i, &sh) == 0 && sh.sh_type == SHT_SYMTAB &&
        symtab_has(elf, len, &eh, &sh, name))
      return 1;
  }
  return 0;
}

static int is_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_' || c == '$';
}

/* PTX declares a kernel as ".entry name(" (possibly with spaces). */
static int ptx_has(const char *ptx, size_t len, const char *name) {
  static const char tag[] = ".entry";
  size_t n = strlen(name);
  const char *end = ptx + len, *p = ptx;
  while ((p = memmem(p, (size_t)(end - p), tag, sizeof tag - 1)) != NULL) {
    p += sizeof tag - 1;
    const char *q = p;
    while (q < end && (*q == ' ' || *q == '\t'))
      q++;
    if (q > p && (size_t)(end - q) >= n && memcmp(q, name, n) == 0 &&
        (q + n == end || !is_ident(q[n])))
      return 1;
  }
  return 0;
}

int kcg_code_has_entry(kc_file_kind kind, const void *code, size_t len,
                       const char *name) {
  if (!code || !name || !*name)
    return 0;
  if (kind == KC_KIND_PTX)
    return ptx_has(code, len, name);
  return cubin_has(code, len, name);
}
