#!/usr/bin/env python3
# Emulates, in numpy, the index logic of kernels/attention.cu's attention_tq_query and
# attention_decode_tq_codes (rows staged as 4-byte words of the KV head's blocks and index
# bytes, 4-bit sketch tables, outliers rotated in by a sign flip) on random TurboQuant rows,
# against a direct computation of the estimate (runit_backend::turbo's algorithm). Prints the largest score and output differences
# for four layouts (tq4/tq4, tq3 keys/tq3 values, tq4/tq3 and tq3/tq4 with heads of 64), every KV
# head of each (so blocks at offsets of 2 mod 4 too), and the tensor-core scores (TQ_MMA_SCORES:
# fragments as mma.cuh lays them out, f16 hi + lo halves) relative to the scores' scale, the
# tensor-core decode's and the tensor-core prefill's (keys' outliers rotated into the key tile)
# scores and outputs relative to theirs. Needs numpy.
import numpy as np, struct
rng = np.random.default_rng(7)
B=64; OUT=2
def splitmix(block, which):
    M=(1<<64)-1
    z=(block + (0x52756e4954545130 if which==0 else 0x534b455443483031)) & M
    z=(z*0x9e3779b97f4a7c15)&M
    z=((z^(z>>30))*0xbf58476d1ce4e5b9)&M
    z=((z^(z>>27))*0x94d049bb133111eb)&M
    return z^(z>>31)
H = np.array([[(-1)**bin(i&j).count('1') for j in range(B)] for i in range(B)], float)
def signs(block, which): s=splitmix(block,which); return np.array([-1.0 if s>>i&1 else 1.0 for i in range(B)])
def R(block): return H @ np.diag(signs(block,0)) / 8
def S(block): return H @ np.diag(signs(block,1))
f16 = lambda x: float(np.float16(x))
def h2b(x): return struct.pack('<e', x)
cent4 = np.sort(rng.normal(size=16))*0.2; cent3=np.sort(rng.normal(size=8))*0.2; sf = np.sqrt(np.pi/2)/64
class Layout:
    def __init__(s,bits,sketch): s.bits=bits; s.sketch=sketch
    header=property(lambda s: 4 if s.sketch else 2)
    code_offset=property(lambda s: s.header+4)
    sign_offset=property(lambda s: s.code_offset + 8*s.bits)
    block_bytes=property(lambda s: s.sign_offset + (8 if s.sketch else 0))
    def index_bytes(s,blocks): return (blocks*12+7)//8
    def row_bytes(s,blocks): return (blocks*s.block_bytes + s.index_bytes(blocks) + 3)//4*4
def make_row(L, blocks):
    """random row: per block norm, rnorm, outliers, codes, signs; returns bytes and decoded fields"""
    out=bytearray(L.row_bytes(blocks)); fields=[]; idxs=[]
    for b in range(blocks):
        o=b*L.block_bytes
        norm=f16(abs(rng.normal())+0.5); out[o:o+2]=h2b(norm)
        rn=0.0
        if L.sketch: rn=f16(abs(rng.normal())*0.3); out[o+2:o+4]=h2b(rn)
        ov=[f16(rng.normal()*3) for _ in range(2)]
        for k in range(2): out[o+L.header+2*k:o+L.header+2*k+2]=h2b(ov[k])
        codes=rng.integers(0,1<<L.bits,B)
        bitpos=0; co=o+L.code_offset
        for i,c in enumerate(codes):
            for t in range(L.bits):
                if c>>t&1: out[co+(bitpos>>3)] |= 1<<(bitpos&7)
                bitpos+=1
        sg=rng.integers(0,2,B)
        if L.sketch:
            for i in range(B):
                if sg[i]: out[o+L.sign_offset+(i>>3)] |= 1<<(i&7)
        ix=list(rng.choice(B,2,replace=False))
        idxs+=ix
        fields.append((norm,rn,ov,codes,sg,ix))
    base=blocks*L.block_bytes
    for s_,ix in enumerate(idxs):
        for t in range(6):
            if ix>>t&1: bit=6*s_+t; out[base+(bit>>3)] |= 1<<(bit&7)
    return bytes(out), fields
def ref_score(q, fields, kv_head, hb, bits):
    tot=0.0
    for b in range(hb):
        norm,rn,ov,codes,sg,ix=fields[kv_head*hb+b]
        gb=kv_head*hb+b; qq=q[b*64:(b+1)*64]
        cent=cent4 if bits==4 else cent3
        rq=R(gb)@qq
        tot += norm*(rq@cent[codes])
        if rn: tot += sf*rn*norm * ((S(gb)@rq) @ (1-2*sg))
        tot += sum(qq[i]*v for i,v in zip(ix,ov))
    return tot
def ref_value(fields, kv_head, hb, bits):
    v=np.zeros(64*hb)
    for b in range(hb):
        norm,rn,ov,codes,sg,ix=fields[kv_head*hb+b]; gb=kv_head*hb+b
        cent=cent4 if bits==4 else cent3
        v[b*64:(b+1)*64]=R(gb).T@(norm*cent[codes])
        for i,x in zip(ix,ov): v[b*64+i]+=x
    return v
# ---- emulated kernels ----
def tq_slice(L,row_blocks,first_block,hb):
    fb=first_block*12; eb=(first_block+hb)*12
    return dict(row_bytes=L.row_bytes(row_blocks), block_offset=first_block*L.block_bytes, block_span=hb*L.block_bytes,
        index_offset=row_blocks*L.block_bytes+fb//8, index_span=(eb+7)//8-fb//8, index_bit=fb%8)
def staging(sl):
    """TqStaging: the row offsets of the words lanes 0..31 copy (None: none)"""
    bs=sl['block_offset']&3; bw=(bs+sl['block_span']+3)//4; ish=sl['index_offset']&3; iw=(ish+sl['index_span']+3)//4
    lanes=[sl['block_offset']-bs+4*l if l<bw else sl['index_offset']-ish+4*(l-bw) if l<bw+iw else None for l in range(32)]
    return dict(shift=bs, words=bw, index_shift=ish, lanes=lanes)
def stage(row, st, words):
    out=bytearray(4*words)
    for lane,off in enumerate(st['lanes']):
        if off is not None:
            assert off%4==0 and off+4<=len(row) and lane<words
            out[4*lane:4*lane+4]=row[off:off+4]
    return bytes(out)
def word_at(bs, at):
    lo,hi=struct.unpack_from('<2I', bs, at&~3) if (at&3) else (struct.unpack_from('<I', bs, at)[0],0)
    return ((lo|hi<<32)>>16)&0xffffffff if at&3 else lo
u16=lambda bs,at: struct.unpack_from('<H',bs,at)[0]
def index_at(bs,bit):
    sh=bit&7; w=bs[bit>>3]
    if sh+6>8: w|=bs[(bit>>3)+1]<<8
    return (w>>sh)&63
def code_at(bs,i,bits):
    bit=i*bits; sh=bit&7; w=bs[bit>>3]
    if sh+bits>8: w|=bs[(bit>>3)+1]<<8
    return (w>>sh)&((1<<bits)-1)
hf=lambda u: float(np.frombuffer(struct.pack('<H',u),dtype=np.float16)[0])
def halves(x):
    """TQ_MMA_SCORES's split: f16 hi and f16 lo of what hi leaves"""
    hi=float(np.float16(x)); return hi, float(np.float16(x-hi))
def mma_scores(keys,kst,kl,ks,hb,n,n_heads,rot,lut,plain):
    """TQ_MMA_SCORES: each lane's fragment registers as the kernel fills them, assembled into
    the m16n8k16 matrices by mma.cuh's layout (lane 4 g + t), multiplied, read back the same way"""
    cent=cent4  # key codes are 4 bits
    out=np.zeros((n_heads,n))
    for warp in range((n+15)//16):
        part=np.zeros((32,4))
        for b in range(hb):
            cd=np.zeros((32,4)); sd=np.zeros((32,4))
            for kk in range(4):
                A=np.zeros((2,16,16)); Bq=np.zeros((2,16,8)); Bs=np.zeros((2,16,8)); As=np.zeros((16,16))
                for lane in range(32):
                    gid,tig=lane>>2,lane&3; r0=16*warp+gid; r1=r0+8
                    key=[keys[min(r0,n-1)],keys[min(r1,n-1)]]
                    at=kst['shift']+b*kl.block_bytes; byte=at+kl.code_offset+8*kk+tig
                    for row,kb,col in [(0,0,0),(1,0,0),(0,4,8),(1,4,8)]:  # a0..a3: (row g, k 2t), (g+8, 2t), (g, 2t+8), (g+8, 2t+8)
                        v=key[row][byte+kb]
                        for h,nib in enumerate((v&15, v>>4)):
                            hi,lo=halves(cent[nib]); A[0][gid+8*row][2*tig+col+h]=hi; A[1][gid+8*row][2*tig+col+h]=lo
                        if kl.sketch:
                            s=struct.unpack_from('<Q',key[row],at+kl.sign_offset)[0]; c=16*kk+2*tig+col
                            for h in range(2): As[gid+8*row][2*tig+col+h]= -1.0 if s>>(c+h)&1 else 1.0
                    g,c=gid,16*kk+2*tig
                    for off in (0,8):
                        for h in range(2):
                            hi,lo=halves(rot[g][b][c+off+h]); Bq[0][2*tig+off+h][g]=hi; Bq[1][2*tig+off+h][g]=lo
                            coord=c+off+h; sv=lut[b][coord//4][g][1<<(coord%4)]
                            hi,lo=halves(sv); Bs[0][2*tig+off+h][g]=hi; Bs[1][2*tig+off+h][g]=lo
                C=A[0]@Bq[0]+A[1]@Bq[0]+A[0]@Bq[1]; S=As@Bs[0]+As@Bs[1]
                for lane in range(32):
                    gid,tig=lane>>2,lane&3
                    cd[lane]+=[C[gid][2*tig],C[gid][2*tig+1],C[gid+8][2*tig],C[gid+8][2*tig+1]]
                    sd[lane]+=[S[gid][2*tig],S[gid][2*tig+1],S[gid+8][2*tig],S[gid+8][2*tig+1]]
            for lane in range(32):
                gid,tig=lane>>2,lane&3; r=[16*warp+gid,16*warp+gid+8]
                for i,row in enumerate(r):
                    key=keys[min(row,n-1)]; at=kst['shift']+b*kl.block_bytes; norm=hf(u16(key,at))
                    for h in range(2):
                        part[lane][2*i+h]+=norm*cd[lane][2*i+h]
                        if kl.sketch: part[lane][2*i+h]+=sf*hf(u16(key,at+2))*norm*sd[lane][2*i+h]
                        g=2*tig+h
                        for o in range(2):
                            ix=index_at(key[4*kst['words']+kst['index_shift']:],ks['index_bit']+(b*2+o)*6)
                            part[lane][2*i+h]+=hf(u16(key,at+kl.header+2*o))*plain[g][b*64+ix]
        for lane in range(32):
            gid,tig=lane>>2,lane&3
            for i,row in enumerate([16*warp+gid,16*warp+gid+8]):
                for h in range(2):
                    g=2*tig+h
                    if row<n and g<n_heads: out[g][row]=part[lane][2*i+h]
    return out
def emulate(qs_heads, krows, vrows, kl, vl, kv_heads, kv_head, hb, scale):
    n_heads=len(qs_heads); fb=kv_head*hb; row_blocks=kv_heads*hb
    # query kernel
    rot=np.zeros((8,2,68)); plain=np.zeros((8,128))
    for g in range(n_heads):
        for d in range(64*hb):
            b,e=d//64,d%64; v=qs_heads[g][d]; plain[g][d]=v
            rot[g][b][e]= -v*0.125 if splitmix(fb+b,0)>>e&1 else v*0.125
    for g in range(8):
        for b in range(2): rot[g][b][:64]=H@rot[g][b][:64]
    sk=np.zeros((8,2,68)); tot=np.zeros((2,8)); lut=np.zeros((2,16,8,16))
    if kl.sketch:
        for g in range(8):
            for b in range(2):
                x=rot[g][b][:64]*np.array([-1 if splitmix(fb+b,1)>>e&1 else 1 for e in range(64)])
                sk[g][b][:64]=H@x; tot[b][g]=sk[g][b][:64].sum()
                for pos in range(16):
                    for v in range(16): lut[b][pos][g][v]=sum(sk[g][b][4*pos+k] for k in range(4) if v>>k&1)
    ks=tq_slice(kl,row_blocks,fb,hb); vs=tq_slice(vl,row_blocks,fb,hb)
    kst=staging(ks); vst=staging(vs)
    n=len(krows)
    keys=[stage(krows[j],kst,27) for j in range(n)]; vals=[stage(vrows[j],vst,22) for j in range(n)]
    ktab=cent4 if kl.bits==4 else cent3; vtab=cent4 if vl.bits==4 else cent3
    scores=np.zeros((n_heads,n))
    for j in range(n):
        for b in range(hb):
            key=keys[j]; at=kst['shift']+b*kl.block_bytes; norm=hf(u16(key,at))
            dot=np.zeros(8)
            for ww in range(8):
                word=word_at(key, at+kl.code_offset+4*ww)
                for e in range(8):
                    c=ktab[(word>>(4*e))&15] if kl.bits==4 else None
                    for g in range(n_heads): dot[g]+=c*rot[g][b][8*ww+e]
            part=norm*dot
            if kl.sketch:
                assert (at+kl.sign_offset)%4==0
                alpha=sf*hf(u16(key,at+2))*norm; lo,hi=struct.unpack_from('<2I',key,at+kl.sign_offset); neg=np.zeros(8)
                for pos in range(16):
                    v=((lo>>(4*pos)) if pos<8 else (hi>>(4*pos-32)))&15
                    for g in range(n_heads): neg[g]+=lut[b][pos][g][v]
                part+=alpha*(tot[b]-2*neg)
            for o in range(2):
                ix=index_at(key[4*kst['words']+kst['index_shift']:],ks['index_bit']+(b*2+o)*6); v=hf(u16(key,at+kl.header+2*o))
                for g in range(n_heads): part[g]+=v*plain[g][b*64+ix]
            scores[:,j]+=part[:n_heads]
    scores*=scale
    mma=mma_scores(keys,kst,kl,ks,hb,n,n_heads,rot,lut,plain)*scale
    w=np.exp(scores-scores.max(1,keepdims=True)); ssum=w.sum(1)
    acc=np.zeros((n_heads,64*hb))
    for j in range(n):
        for quad in range(16*hb):  # a thread's four coordinates: codes from two staged bytes
            b,ve=4*quad//64,4*quad%64; val=vals[j]; at=vst['shift']+b*vl.block_bytes
            vn=hf(u16(val,at))
            bit=ve*vl.bits; cb=at+vl.code_offset+bit//8; word=(val[cb]|val[cb+1]<<8)>>(bit%8)
            v=[vn*vtab[(word>>(k*vl.bits))&((1<<vl.bits)-1)] for k in range(4)]
            for o in range(2):
                ix=index_at(val[4*vst['words']+vst['index_shift']:],vs['index_bit']+(b*2+o)*6)
                ov=hf(u16(val,at+vl.header+2*o))*0.125*(-1 if splitmix(fb+b,0)>>ix&1 else 1)
                base=bin(ve&ix).count('1')&1
                for k in range(4):
                    v[k]+= -ov if base^(bin(k&ix).count('1')&1) else ov
            for k in range(4): acc[:,4*quad+k]+=w[:,j]*v[k]
    out=acc/ssum[:,None]
    # rotate back R^T per block
    res=np.zeros_like(out)
    for g in range(n_heads):
        for b in range(hb): res[g][b*64:(b+1)*64]=R(fb+b).T@out[g][b*64:(b+1)*64]
    return scores,res,mma
def bytes_at(bs, at):
    """tq_bytes_at: the 4 bytes from `at` on, any offset"""
    return struct.unpack_from('<I', bytes(bs)+bytes(8), at)[0]
def emulate_mma(qs_heads, krows, vrows, kl, vl, kv_heads, kv_head, hb, scale, prefill=False):
    """attention_decode_tq_mma_*'s index logic: f16 rows of R q and S R q, a sub-tile's keys
    decoded by group of 8 coordinates (centroid pairs by code byte times the norm, signs by
    nibble times alpha, f16 products), the outliers' scores, the values decoded alike with their
    outliers rotated into the f16 tile (+-v/8 by the signs, H's row i & 7 per 8 coordinates).
    With `prefill`, attention_prefill_tq_mma_*'s: the keys' outliers rotated into the key tile
    as the values' are, no scores of their own"""
    n_heads=len(qs_heads); fb=kv_head*hb; row_blocks=kv_heads*hb; D=64*hb
    h16=lambda x: np.float16(x).astype(float)
    plain=np.zeros((8,D)); qrot=np.zeros((8,D)); qsk=np.zeros((8,D))
    for g in range(n_heads):
        plain[g]=qs_heads[g]
        for b in range(hb):
            r=R(fb+b)@qs_heads[g][b*64:(b+1)*64]; qrot[g][b*64:(b+1)*64]=r
            qsk[g][b*64:(b+1)*64]=S(fb+b)@r
    qrot=h16(qrot); qsk=h16(qsk)
    ks=tq_slice(kl,row_blocks,fb,hb); vs=tq_slice(vl,row_blocks,fb,hb); kst=staging(ks); vst=staging(vs)
    n=len(krows)
    raw=[stage(krows[j],kst,27)+stage(vrows[j],vst,22) for j in range(n)]
    kc=cent4; vc=cent4 if vl.bits==4 else cent3; vm=(1<<vl.bits)-1
    def rotate_in(row, bs, st, sl, L, b, within, group):
        """tq_add_outliers: a block's outliers rotated into 8 coordinates of an f16 tile row"""
        at=st['shift']+b*L.block_bytes
        for o in range(2):
            ix=index_at(bs[4*st['words']+st['index_shift']:],sl['index_bit']+(b*2+o)*6)
            h=h16(hf(u16(bs,at+L.header+2*o))*0.125*(-1 if splitmix(fb+b,0)>>ix&1 else 1))
            if bin(within&(ix>>3)).count('1')&1: h=-h
            for e in range(8):
                sg=-1 if bin(e&(ix&7)).count('1')&1 else 1
                row[group*8+e]=h16(sg*h+row[group*8+e])
    Kt=np.zeros((n,D)); St=np.zeros((n,D)); Vt=np.zeros((n,D)); bias=np.zeros((n,8))
    for j in range(n):
        key=raw[j][:108]; val=raw[j][108:]
        for group in range(D//8):
            b,within=group//8,group%8
            at=kst['shift']+b*kl.block_bytes; norm=hf(u16(key,at))
            codes=word_at(key,at+kl.code_offset+4*within)
            for p_ in range(4):
                byte=codes>>(8*p_)&255
                Kt[j][group*8+2*p_]=h16(h16(kc[byte&15])*norm); Kt[j][group*8+2*p_+1]=h16(h16(kc[byte>>4])*norm)
            if prefill: rotate_in(Kt[j], key, kst, ks, kl, b, within, group)
            if kl.sketch:
                alpha=h16(sf*hf(u16(key,at+2))*norm); byte=key[at+kl.sign_offset+within]
                for e in range(8): St[j][group*8+e]=-alpha if byte>>e&1 else alpha
            vat=vst['shift']+b*vl.block_bytes; vn=hf(u16(val,vat))
            codes=bytes_at(val,vat+vl.code_offset+vl.bits*within)
            for p_ in range(4):
                i=codes>>(2*vl.bits*p_)&((1<<2*vl.bits)-1)
                Vt[j][group*8+2*p_]=h16(h16(vc[i&vm])*vn); Vt[j][group*8+2*p_+1]=h16(h16(vc[i>>vl.bits&vm])*vn)
            rotate_in(Vt[j], val, vst, vs, vl, b, within, group)
        for b in range(hb if not prefill else 0):
            at=kst['shift']+b*kl.block_bytes
            for o in range(2):
                ix=index_at(key[4*kst['words']+kst['index_shift']:],ks['index_bit']+(b*2+o)*6); v=hf(u16(key,at+kl.header+2*o))
                for g in range(8): bias[j][g]+=v*plain[g][b*64+ix]
    scores=(qrot@Kt.T+qsk@St.T+bias.T)[:n_heads]*scale
    w=np.exp(scores-scores.max(1,keepdims=True)); ssum=w.sum(1)
    acc=w@Vt
    out=acc/ssum[:,None]
    res=np.zeros_like(out)
    for g in range(n_heads):
        for b in range(hb): res[g][b*64:(b+1)*64]=R(fb+b).T@out[g][b*64:(b+1)*64]
    return scores,res
for (kbits,ksk,vbits,hb,kv_heads) in [(4,True,4,2,4),(4,False,3,2,2),(4,True,3,1,3),(4,False,4,1,3)]:
    kl=Layout(kbits,ksk); vl=Layout(vbits,False)
    rb=kv_heads*hb; n=20; nh=3
    K=[make_row(kl,rb) for _ in range(n)]; V=[make_row(vl,rb) for _ in range(n)]
    for kvh in range(kv_heads):
        q=[rng.normal(size=64*hb) for _ in range(nh)]
        sc,res,mma=emulate(q,[k[0] for k in K],[v[0] for v in V],kl,vl,kv_heads,kvh,hb,0.1)
        ref=np.array([[ref_score(q[g],K[j][1],kvh,hb,kbits) for j in range(n)] for g in range(nh)])*0.1
        wr=np.exp(ref-ref.max(1,keepdims=True)); wr/=wr.sum(1,keepdims=True)
        vref=np.array([ref_value(V[j][1],kvh,hb,vbits) for j in range(n)])
        outref=wr@vref
        msc,mres=emulate_mma(q,[k[0] for k in K],[v[0] for v in V],kl,vl,kv_heads,kvh,hb,0.1)
        psc,pres=emulate_mma(q,[k[0] for k in K],[v[0] for v in V],kl,vl,kv_heads,kvh,hb,0.1,prefill=True)
        rel=lambda a,b: np.abs(a-b).max()/np.abs(b).max()
        print(kbits,ksk,vbits,hb,kvh, np.abs(sc-ref).max(), np.abs(res-outref).max(), 'mma scores', rel(mma,ref),
              'tensor-core decode: scores', rel(msc,ref), 'outputs', rel(mres,outref),
              'prefill: scores', rel(psc,ref), 'outputs', rel(pres,outref))
